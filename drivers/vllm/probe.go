// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Probe implements sdk.Driver. READINESS waits for the served name in
// /v1/models and a real answer to the canary prompt (reasoning first
// counts), failing at once with the engine's last log lines when it exits.
// A parked (sleeping) engine is reported alive and not ready at once:
// a request to it would wait until it wakes. A group's worker (--headless)
// serves no HTTP: it is ready once its process runs, and has no canary.
func (d *Driver) Probe(ctx context.Context, req *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	in, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	switch req.Kind {
	case sdk.ProbeKindLiveness:
		return in.Liveness(), nil
	case sdk.ProbeKindReadiness:
		if !in.Alive() {
			return in.ExitInfo("the engine process is gone"), nil
		}
		deadline := enginekit.ProbeDeadline(req, pyengine.StartupTimeout(pyengine.WeightsBytes(in.ModelDir)))
		if in.Worker() {
			// A --headless rank serves no HTTP: its process is its
			// readiness; the group is ready when its head is.
			return in.WaitReady(ctx, deadline, enginekit.WorkerReady, nil, nil), nil
		}
		if tier := in.Parked(); tier != "" {
			return &sdk.ProbeResponse{Alive: true, Detail: "the engine is asleep (parked " + tier + "): wake it first"}, nil
		}
		return in.WaitReady(ctx, deadline, in.ChatReady(canaryPrompt, canaryTokens, nil), nil, nil), nil
	case sdk.ProbeKindWakeCheck:
		if in.Worker() {
			// The wake check is the head's canary; a worker has none.
			return in.Liveness(), nil
		}
		return in.WakeCheck(ctx, wakeCanary(in)), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.Kind)
}

// wakeCanary asks the canary prompt once.
func wakeCanary(in *enginekit.Instance) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		switch in.API {
		case "embeddings":
			return engineapi.EmbeddingsProbe(ctx, in.Client, in.ServedName, canaryPrompt)
		case "rerank":
			return engineapi.RerankProbe(ctx, in.Client, in.ServedName, canaryPrompt, engineapi.RerankCanaryDocuments)
		}
		return engineapi.ChatProbe(ctx, in.Client, enginekit.ChatPath, in.ServedName, canaryPrompt, canaryTokens)
	}
}

// Abort implements sdk.Driver: vLLM aborts a request when its connection
// closes; there is nothing to send.
func (d *Driver) Abort(context.Context, *sdk.AbortRequest) (*sdk.AbortResponse, error) {
	return &sdk.AbortResponse{Mode: sdk.AbortModeCloseConnection}, nil
}

// Load implements sdk.Driver: vllm:num_requests_running and _waiting of the
// served model, and the KV cache usage.
func (d *Driver) Load(ctx context.Context, req *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	return d.reg.Load(ctx, req, metricNames)
}

// Stop implements sdk.Driver.
func (d *Driver) Stop(_ context.Context, req *sdk.StopRequest) (*sdk.StopResponse, error) {
	return d.reg.Stop(req, enginekit.DefaultStopGrace, enginekit.StopHooks{})
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch and, for a deployment that parks, asks the engine whether it is
// asleep.
func (d *Driver) Recover(ctx context.Context, req *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return d.reg.Recover(req, func(launched proc.Launched, detail string) (*enginekit.Instance, string, error) {
		l := &req.Launch
		// An engine that joined its LMCache server's network namespace is
		// reached only there: read again from /proc.
		netns, err := proc.OwnNetns(launched.Engine)
		if err != nil {
			return nil, "", fmt.Errorf("the engine's network namespace: %w", err)
		}
		in := d.instance(req.InstanceID, l.LaunchID, launched, int(l.Port), req.EngineKey, &req.Deployment,
			enginekit.SocketOf(launched.LaunchDir), residency(&req.Deployment), netns)
		pyengine.SaltWithLMCache(in.Endpoint, l.LMCachePort != 0)
		if !enginekit.Parks(in.Residency) {
			return in, detail, nil
		}
		if in.Worker() {
			// A --headless rank has no /is_sleeping: the record decides.
			tier := req.ParkTier
			if tier == "" {
				tier = enginekit.RecordedPark(launched.LaunchDir)
			}
			in.MarkParked(tier)
			return in, detail, nil
		}
		// vLLM says whether it sleeps: that, not the record, decides.
		asleep, err := isSleeping(ctx, in)
		switch {
		case err != nil:
			return nil, "", errors.New("the engine runs but does not say whether it sleeps: " + err.Error())
		case asleep:
			tier := req.ParkTier
			if tier == "" {
				tier = enginekit.RecordedPark(launched.LaunchDir)
			}
			if tier == "" {
				tier = in.Residency
			}
			in.MarkParked(tier)
			detail += "; the engine is asleep (parked " + tier + ")"
		default:
			in.MarkParked("")
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
