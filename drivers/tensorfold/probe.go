// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"context"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/proc"
)

// canaryPrompt is the fixed prompt whose answer proves readiness.
const canaryPrompt = "Say ready."

// health is TensorFold's GET /health.
type health struct {
	OK              bool   `json:"ok"`
	Status          string `json:"status"`
	RequestsRunning *int64 `json:"requests_running"`
	RequestsWaiting *int64 `json:"requests_waiting"`
	Busy            *bool  `json:"busy"`
}

// Probe implements sdk.Driver. Readiness is /health ok, the served name in
// /v1/models, then a real answer; the first answer waits for the kernel
// build, which each attempt joins until the startup budget runs out. Rank
// 1 of a two-machine pair serves no HTTP: it is ready once its process
// runs.
func (d *Driver) Probe(ctx context.Context, req *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	in, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	switch req.Kind {
	case sdk.ProbeKindLiveness:
		return in.Liveness(), nil
	case sdk.ProbeKindReadiness, sdk.ProbeKindWakeCheck:
		if in.Worker() {
			// Rank 1 of a pair serves no HTTP: its process is its
			// readiness, and it has no canary.
			return in.WaitReady(ctx, enginekit.ProbeDeadline(req, StartupTimeout), enginekit.WorkerReady, nil, nil), nil
		}
		chat := in.ChatReady(canaryPrompt, 8, nil)
		ready := func(ctx context.Context) (bool, string, string) {
			var h health
			if _, err := in.Client.GetJSON(ctx, "/health", &h); err != nil || !h.OK {
				return false, "", "waiting for /health"
			}
			return chat(ctx)
		}
		return in.WaitReady(ctx, enginekit.ProbeDeadline(req, StartupTimeout), ready, nil, nil), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.Kind)
}

// Load implements sdk.Driver: the idle signal is /health's
// requests_running and busy (a busy engine with nothing counted is
// building kernels for a request).
func (d *Driver) Load(ctx context.Context, req *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	in, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	if in.Worker() {
		return enginekit.WorkerLoad(), nil
	}
	unknown := &sdk.LoadResponse{Known: false, KVUsage: enginekit.KVUsageUnknown}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var h health
	status, err := in.Client.GetJSON(lctx, "/health", &h)
	if err != nil || status != http.StatusOK || h.RequestsRunning == nil || h.Busy == nil {
		return unknown, nil
	}
	out := &sdk.LoadResponse{Known: true, Running: *h.RequestsRunning, KVUsage: enginekit.KVUsageUnknown}
	if h.RequestsWaiting != nil {
		out.Waiting = *h.RequestsWaiting
	}
	if *h.Busy && out.Running == 0 && out.Waiting == 0 {
		out.Running = 1
	}
	return out, nil
}

// Stop implements sdk.Driver.
func (d *Driver) Stop(_ context.Context, req *sdk.StopRequest) (*sdk.StopResponse, error) {
	return d.reg.Stop(req, enginekit.DefaultStopGrace, enginekit.StopHooks{})
}

// Recover implements sdk.Driver.
func (d *Driver) Recover(_ context.Context, req *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return d.reg.Recover(req, func(launched proc.Launched, detail string) (*enginekit.Instance, string, error) {
		l := &req.Launch
		return instance(req.InstanceID, l.LaunchID, launched, int(l.Port), &req.Deployment), detail, nil
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
