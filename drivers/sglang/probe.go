// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/decisions"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Probe implements sdk.Driver. READINESS waits for the served name in
// /v1/models and a real answer to the canary prompt (a complete decision
// for a decision model); a group's worker rank, which serves no API, for
// its health check (workerReady), without a canary. It fails at once, with the engine's last log
// lines, when the engine exits or when SGLang's scheduler dies while the
// model loads: then the driver ends the launch's remaining processes and
// removes the shared-memory segments it made, instead of waiting out the
// deadline for a server that will never be ready.
func (d *Driver) Probe(ctx context.Context, req *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	in, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	switch req.Kind {
	case sdk.ProbeKindLiveness:
		if in.Alive() {
			shm(in.Launched.LaunchDir).Observe(proc.GroupPIDs(in.Launched.Pgid))
		}
		return in.Liveness(), nil
	case sdk.ProbeKindReadiness:
		if !in.Alive() {
			return in.ExitInfo("the engine process is gone"), nil
		}
		if tier := in.Parked(); tier != "" {
			return &sdk.ProbeResponse{Alive: true, Detail: "the engine's memory is released (parked " + tier + "): wake it first"}, nil
		}
		deadline := enginekit.ProbeDeadline(req, pyengine.StartupTimeout(pyengine.WeightsBytes(in.ModelDir)))
		ready := in.ChatReady(canaryPrompt, canaryTokens, canaryExtra)
		switch {
		case in.Worker():
			ready = workerReady(in)
		case in.API == "decisions":
			ready = decisionReady(in)
		}
		fail := func() {
			_ = enginekit.StopLaunch(in.Launched, in.StopGrace)
			shm(in.Launched.LaunchDir).Clean()
			removeConfig(in.Launched.LaunchDir)
		}
		resp := in.WaitReady(ctx, deadline, ready, schedulerWatch(in), fail)
		if resp.Ready {
			// SGLang read its key at start; the file has done its work.
			removeConfig(in.Launched.LaunchDir)
		}
		return resp, nil
	case sdk.ProbeKindWakeCheck:
		if in.Worker() {
			// The wake check is the head's canary; a worker has none.
			return in.Liveness(), nil
		}
		return in.WakeCheck(ctx, wakeCanary(in)), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.Kind)
}

// workerReady is a group worker's readiness: SGLang's non-zero node ranks
// serve no API, only a "dummy health check server" on their --host and
// --port once their schedulers are ready (launch_dummy_health_check_server
// in python/sglang/srt/utils.py, called from _launch_subprocesses in
// python/sglang/srt/entrypoints/engine.py): GET /health answers 200.
// There is no canary.
func workerReady(in *enginekit.Instance) enginekit.ReadyFunc {
	return func(ctx context.Context) (bool, string, string) {
		resp, err := in.Client.Get(ctx, "/health")
		if err != nil {
			return false, "", "waiting for the worker's health check: " + err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return false, "", "waiting for the worker's health check: GET /health answered " + strconv.Itoa(resp.StatusCode)
		}
		return true, "", ""
	}
}

// schedulerWatch notices SGLang's scheduler dying while the server waits
// for it: a scheduler process seen in the launch's group that is gone, or
// the scheduler's exception in the log. It also notes the shared-memory
// segments the launch's processes hold.
func schedulerWatch(in *enginekit.Instance) enginekit.WatchFunc {
	seen := map[int]bool{}
	s := shm(in.Launched.LaunchDir)
	return func() (bool, string) {
		pids := proc.GroupPIDs(in.Launched.Pgid)
		s.Observe(pids)
		live := map[int]bool{}
		for _, pid := range pids {
			live[pid] = true
			if strings.HasPrefix(proc.ProcessName(pid), schedulerComm) {
				seen[pid] = true
			}
		}
		for pid := range seen {
			if !live[pid] {
				return true, fmt.Sprintf("SGLang's scheduler (pid %d) died while the model loaded; the launch was ended", pid)
			}
		}
		for _, l := range proc.LastLines(in.Launched.LaunchDir, 40) {
			if strings.Contains(l, schedulerDied) {
				return true, "SGLang's scheduler failed while the model loaded; the launch was ended"
			}
		}
		return false, ""
	}
}

// decisionReady proves a decision model ready: the served name listed, and
// a complete answer to the fixed readiness decision.
func decisionReady(in *enginekit.Instance) enginekit.ReadyFunc {
	return func(ctx context.Context) (bool, string, string) {
		if why := in.ServedListed(ctx); why != "" {
			return false, "", why
		}
		resp, why := enginekit.ReadinessDecision(ctx, in.Client, decisionsPath, in.ServedName, "waiting for a first decision")
		if resp == nil {
			return false, "", why
		}
		return true, decisionCanary(*resp), ""
	}
}

// decisionCanary renders a decision's probabilities, rounded, as its canary.
func decisionCanary(resp decisions.Response) string {
	var parts []string
	for _, a := range resp.Answers {
		labels := make([]string, 0, len(a.Probabilities))
		for l := range a.Probabilities {
			labels = append(labels, l)
		}
		sort.Strings(labels)
		for _, l := range labels {
			parts = append(parts, a.ID+"."+l+"="+strconv.FormatFloat(a.Probabilities[l], 'f', 2, 64))
		}
	}
	return strings.Join(parts, " ")
}

// wakeCanary asks the canary prompt once (the readiness decision of a
// decision model).
func wakeCanary(in *enginekit.Instance) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if in.API == "decisions" {
			ok, canary, why := decisionReady(in)(ctx)
			if !ok {
				return "", fmt.Errorf("%s", why)
			}
			return canary, nil
		}
		if in.API == "embeddings" {
			return engineapi.EmbeddingsProbe(ctx, in.Client, in.ServedName, canaryPrompt)
		}
		return engineapi.ChatProbeExtra(ctx, in.Client, enginekit.ChatPath, in.ServedName, canaryPrompt, canaryTokens, canaryExtra)
	}
}

// Abort implements sdk.Driver: POST /abort_request {"rid"} with the ID the
// router put in the request body. With several tokenizer workers the abort
// may not reach the request's worker: the connection close is then all.
func (d *Driver) Abort(ctx context.Context, req *sdk.AbortRequest) (*sdk.AbortResponse, error) {
	in, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	if in.Worker() || in.Endpoint.AbortMode != sdk.AbortModeRequestID || req.RequestID == "" {
		return &sdk.AbortResponse{Mode: sdk.AbortModeCloseConnection}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body := map[string]any{"rid": req.RequestID, "abort_all": false}
	if _, err := in.Client.PostJSON(ctx, abortPath, body, nil); err != nil {
		return nil, sdk.Errorf("engine_error", "abort request %s: %v", req.RequestID, err)
	}
	return &sdk.AbortResponse{Mode: sdk.AbortModeRequestID, Sent: true}, nil
}

// Load implements sdk.Driver: sglang:num_running_reqs and num_queue_reqs of
// the served model, and the KV pool usage.
func (d *Driver) Load(ctx context.Context, req *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	return d.reg.Load(ctx, req, metricNames)
}

// Stop implements sdk.Driver: the whole group ends, then the launch's
// shared-memory segments that no process holds any more are removed.
func (d *Driver) Stop(_ context.Context, req *sdk.StopRequest) (*sdk.StopResponse, error) {
	return d.reg.Stop(req, enginekit.DefaultStopGrace, enginekit.StopHooks{
		Before: func(launched proc.Launched) {
			if launched.LaunchDir != "" && proc.Alive(launched.Engine) {
				shm(launched.LaunchDir).Observe(proc.GroupPIDs(launched.Pgid))
			}
		},
		Gone: func(launched proc.Launched, resp *sdk.StopResponse) {
			if launched.LaunchDir != "" {
				resp.Cleaned = shm(launched.LaunchDir).Clean()
				removeConfig(launched.LaunchDir)
			}
		},
	})
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch.
func (d *Driver) Recover(_ context.Context, req *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return d.reg.Recover(req, func(launched proc.Launched, detail string) (*enginekit.Instance, string, error) {
		l := &req.Launch
		// A launch in a network namespace of its own is reached only
		// there: the namespace is the engine's, read again from /proc.
		netns, err := proc.OwnNetns(launched.Engine)
		if err != nil {
			return nil, "", fmt.Errorf("the engine's network namespace: %w", err)
		}
		in := d.instance(req.InstanceID, l.LaunchID, launched, int(l.Port), req.EngineKey, &req.Deployment, "", netns)
		pyengine.SaltWithLMCache(in.Endpoint, l.LMCachePort != 0)
		// SGLang has no route that says whether its memory is released: the
		// launch directory records a completed park, and a park the core saw
		// complete counts too.
		tier := enginekit.RecordedPark(launched.LaunchDir)
		if tier == "" && req.RecordedState == "parked" {
			if tier = req.ParkTier; tier == "" {
				tier = in.Residency
			}
		}
		if tier != "" && enginekit.Parks(in.Residency) {
			in.SetParked(tier)
			detail += "; the engine's memory is released (parked " + tier + ")"
		}
		return in, detail, nil
	})
}

// Logs implements sdk.Driver.
func (d *Driver) Logs(_ context.Context, req *sdk.LogsRequest) (*sdk.LogsResponse, error) {
	return d.reg.Logs(req)
}

// WaitExit reports the engine's exit the moment its process is gone.
func (d *Driver) WaitExit(ctx context.Context, req *sdk.WaitExitRequest) (*sdk.ExitEvent, error) {
	return d.reg.WaitExit(ctx, req)
}
