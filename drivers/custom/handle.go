// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/proc"
)

// canaryPrompt is the fixed prompt whose answer proves readiness.
const canaryPrompt = "Reply with one word: ready"

// handle is one running instance of a custom engine: the shared instance
// handle of the first-party drivers, and the manifest it was started from.
type handle struct {
	*enginekit.Instance
	manifest *Manifest
}

// newHandle builds the handle of a launch. The router reaches the engine at
// the manifest's paths, with the key only when the manifest hands the
// engine one (key_env); the stop grace is the manifest's, else grace.
func newHandle(id, launchID string, l proc.Launched, port int, key string, m *Manifest, dep *sdk.Deployment, grace time.Duration) *handle {
	if m.KeyEnv == "" {
		key = ""
	}
	ep := enginekit.NewEndpoint(port, dep.ServedName, key)
	ep.ChatPath, ep.DecisionsPath = m.ChatPath, m.DecisionsPath
	if m.NonStreamedHangup == "stops" {
		ep.NonStreamedHangup = sdk.NonStreamedHangupStops
	}
	in := enginekit.NewInstance(id, launchID, l, port, ep)
	in.API, in.Residency, in.StopGrace = dep.API, enginekit.ResidencyRestartOnly, m.stopGrace(grace)
	if in.API == "" {
		in.API = m.API
	}
	return &handle{Instance: in, manifest: m}
}

// Probe implements sdk.Driver.
func (d *Driver) Probe(ctx context.Context, req *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	h, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	switch req.Kind {
	case sdk.ProbeKindLiveness:
		return h.Liveness(), nil
	case sdk.ProbeKindReadiness, sdk.ProbeKindWakeCheck:
		return h.WaitReady(ctx, enginekit.ProbeDeadline(req, h.manifest.startupTimeout()), h.readyOnce, nil, nil), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.Kind)
}

// readyOnce runs the readiness checks once: health, the served name, and a
// real short answer (a complete readiness decision for a decision model).
func (h *handle) readyOnce(ctx context.Context) (bool, string, string) {
	c := h.Client
	if h.manifest.HealthPath != "" {
		resp, err := c.Get(ctx, h.manifest.HealthPath)
		if err != nil {
			return false, "", "waiting for the health check"
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, "", fmt.Sprintf("health answered %d", resp.StatusCode)
		}
	}
	// The served name and the first answer are asked at once: an engine
	// that answers its health answers both, and a cold start waits for the
	// slower of the two rather than for their sum. Both must pass; the
	// name's answer decides first.
	listed := make(chan bool, 1)
	go func() {
		found, err := engineapi.ModelsContain(ctx, c, h.ServedName)
		listed <- err == nil && found
	}()
	var answer, why string
	if h.API == "decisions" {
		// A decision model is proven ready by the fixed readiness decision,
		// answered with a complete set of probabilities; never a chat.
		if resp, w := enginekit.ReadinessDecision(ctx, c, h.manifest.DecisionsPath, h.ServedName, "waiting for the readiness decision"); resp == nil {
			why = w
		}
	} else if a, err := engineapi.ChatProbe(ctx, c, h.manifest.ChatPath, h.ServedName, canaryPrompt, 8); err != nil {
		why = "waiting for a first answer: " + err.Error()
	} else {
		answer = a
	}
	if !<-listed {
		return false, "", "waiting for " + h.ServedName + " in " + h.manifest.ModelsPath
	}
	if why != "" {
		return false, "", why
	}
	return true, answer, ""
}

// Load implements sdk.Driver: the manifest's idle gauges.
func (d *Driver) Load(ctx context.Context, req *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	h, err := d.reg.Get(req.InstanceID)
	if err != nil {
		return nil, err
	}
	idle := h.manifest.Idle
	if idle == nil {
		return &sdk.LoadResponse{Known: false, KVUsage: enginekit.KVUsageUnknown}, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := h.Client.Get(lctx, idle.MetricsPath)
	if err != nil {
		return &sdk.LoadResponse{Known: false, KVUsage: enginekit.KVUsageUnknown}, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &sdk.LoadResponse{Known: false, KVUsage: enginekit.KVUsageUnknown}, nil
	}
	// A malformed line spoils only itself: the parser keeps the good
	// samples.
	ms, _ := engineapi.ParseMetrics(resp.Body)
	out := &sdk.LoadResponse{KVUsage: enginekit.KVUsageUnknown}
	running, ok := ms.Value(idle.Running, nil)
	if !ok {
		return &sdk.LoadResponse{Known: false, KVUsage: enginekit.KVUsageUnknown}, nil
	}
	out.Known = true
	out.Running = int64(running)
	if idle.Waiting != "" {
		if w, ok := ms.Value(idle.Waiting, nil); ok {
			out.Waiting = int64(w)
		}
	}
	return out, nil
}

// Stop implements sdk.Driver.
func (d *Driver) Stop(_ context.Context, req *sdk.StopRequest) (*sdk.StopResponse, error) {
	return d.reg.Stop(req, d.stopGrace, enginekit.StopHooks{})
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch and the manifest recorded with the installation, and reports the
// engine running or gone (uncertain without the manifest).
func (d *Driver) Recover(_ context.Context, req *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return d.reg.Recover(req, func(launched proc.Launched, detail string) (*handle, string, error) {
		m, err := manifestFromDetails(req.Installation.Details)
		if err != nil {
			return nil, "", err
		}
		l := &req.Launch
		return newHandle(req.InstanceID, l.LaunchID, launched, int(l.Port), req.EngineKey, m, &req.Deployment, d.stopGrace), detail, nil
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
