// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/decisions"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/proc"
)

// canaryPrompt is the fixed prompt whose answer proves a chat model ready.
const canaryPrompt = "Reply with one word: ready"

// metricNames are llama-server's idle signal (--metrics; no labels), from
// the engine table.
var metricNames = enginekit.MetricNamesOf(enginefacts.LlamaCpp.Metrics)

// handle is one running llama-server: the shared instance handle of the
// first-party drivers, and what readiness expects of /props.
type handle struct {
	*enginekit.Instance
	// slots and slotCtx are what /props must report (0 when unknown,
	// after a re-attach without a plan).
	slots   int
	slotCtx int64
	startup time.Duration

	// mismatch is set by readiness when llama-server runs other slots than
	// planned: waiting cannot fix it.
	mu       sync.Mutex
	mismatch string
}

func newHandle(id, launchID string, l proc.Launched, port int, key string, dep *sdk.Deployment, plan *sdk.PlanResponse, grace time.Duration) *handle {
	ep := enginekit.NewEndpoint(port, dep.ServedName, key)
	ep.DecisionsPath = decisions.Path
	// Builds since llama.cpp PR #17570 count a Messages request's tokens
	// through the chat template; an older build answers 404, which the
	// router answers count_tokens_unsupported. Messages and Responses
	// requests are translated to chat (the engine table says why).
	ep.CountTokensPath = enginefacts.LlamaCpp.Route(enginefacts.RouteCountTokens)
	// IMPORTANT: llama-server checks a non-streamed client only when its
	// one-second wait for results times out, and any result (another
	// request's token, a /slots or /metrics call) restarts that wait: under
	// load an abandoned non-streamed request runs to max_tokens
	// (llamaserver-observed.md, "Cancellation"). Streamed, it stops at the
	// next token. So the router streams from it whatever the client asked.
	ep.NonStreamedHangup = sdk.NonStreamedHangupStream
	sock := enginekit.SocketOf(l.LaunchDir)
	if plan != nil {
		sock = enginekit.SocketInArgv(plan.Argv, "--host")
	}
	x := enginekit.Exposure{Socket: sock}
	if sock == "" {
		x.OpenRoutes, x.Note = openRoutes(key), "this llama-server build has no Unix-socket --host"
	}
	x.Apply(ep)
	in := enginekit.NewInstance(id, launchID, l, port, ep)
	in.API, in.ModelDir, in.Residency, in.StopGrace = dep.API, dep.ModelDir, enginekit.ResidencyRestartOnly, grace
	h := &handle{Instance: in, startup: startupBase}
	if plan != nil {
		h.slots, h.slotCtx = slotsOf(plan.Argv)
		if t := plan.StartupTimeout; t > 0 {
			h.startup = t
		}
	}
	return h
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
		watch := func() (bool, string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.mismatch != "", h.mismatch
		}
		return h.WaitReady(ctx, enginekit.ProbeDeadline(req, h.startup), h.readyOnce, watch, nil), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.Kind)
}

// readyOnce runs llama.cpp's readiness checks in order: /health 200 (503
// while loading), the served name in /v1/models, the slots and window in
// /props, then a real answer: a chat reply, or for a decision model the
// readiness decision with a complete set of probabilities.
func (h *handle) readyOnce(ctx context.Context) (bool, string, string) {
	c := h.Client
	status, err := c.GetJSON(ctx, "/health", nil)
	switch {
	case err == nil:
	case status == http.StatusServiceUnavailable:
		return false, "", "loading the model (/health 503)"
	default:
		return false, "", "waiting for /health"
	}
	found, err := engineapi.ModelsContain(ctx, c, h.ServedName)
	if err != nil || !found {
		return false, "", fmt.Sprintf("waiting for %s in /v1/models", h.ServedName)
	}
	var props struct {
		TotalSlots int `json:"total_slots"`
		Default    struct {
			NCtx int64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if _, err := c.GetJSON(ctx, "/props", &props); err != nil {
		return false, "", fmt.Sprintf("waiting for /props: %v", err)
	}
	mismatch := ""
	switch {
	case h.slots > 0 && props.TotalSlots != h.slots:
		mismatch = fmt.Sprintf("llama-server runs %d slots, %d were asked for: the build does not honour --parallel", props.TotalSlots, h.slots)
	case h.slotCtx > 0 && props.Default.NCtx > 0 && props.Default.NCtx < h.slotCtx:
		mismatch = fmt.Sprintf("llama-server gives each slot %d tokens, %d were asked for: the build does not honour --ctx-size", props.Default.NCtx, h.slotCtx)
	}
	if mismatch != "" {
		h.mu.Lock()
		h.mismatch = mismatch
		h.mu.Unlock()
		return false, "", mismatch
	}
	if h.API == "decisions" {
		return h.readinessDecision(ctx)
	}
	probe := func() (string, error) {
		return engineapi.ChatProbe(ctx, c, h.Endpoint.ChatPath, h.ServedName, canaryPrompt, 8)
	}
	switch h.API {
	case "embeddings":
		probe = func() (string, error) { return engineapi.EmbeddingsProbe(ctx, c, h.ServedName, canaryPrompt) }
	case "rerank":
		probe = func() (string, error) {
			return engineapi.RerankProbe(ctx, c, h.ServedName, canaryPrompt, engineapi.RerankCanaryDocuments)
		}
	}
	answer, err := probe()
	if err != nil {
		return false, "", "waiting for a first answer: " + err.Error()
	}
	return true, answer, ""
}

// readinessDecision sends the fixed readiness decision and checks that the
// answer covers every label.
func (h *handle) readinessDecision(ctx context.Context) (bool, string, string) {
	resp, why := enginekit.ReadinessDecision(ctx, h.Client, decisions.Path, h.ServedName, "waiting for the readiness decision")
	if resp == nil {
		return false, "", why
	}
	p := resp.Answers[0].Probabilities
	return true, fmt.Sprintf("yes=%.3f no=%.3f unknown=%.3f", p["yes"], p["no"], p["unknown"]), ""
}

// Load implements sdk.Driver: the idle signal is llama-server's busy slots
// (llamacpp:requests_processing) and queued tasks (requests_deferred).
func (d *Driver) Load(ctx context.Context, req *sdk.LoadRequest) (*sdk.LoadResponse, error) {
	return d.reg.Load(ctx, req, metricNames)
}

// Stop implements sdk.Driver: SIGTERM to the group, SIGKILL after the
// grace, proof that every process is gone. llama-server's exit status
// after SIGTERM is 134 (it aborts on its way out); that is a clean stop.
func (d *Driver) Stop(_ context.Context, req *sdk.StopRequest) (*sdk.StopResponse, error) {
	resp, err := d.reg.Stop(req, d.stopGrace, enginekit.StopHooks{})
	if err == nil && resp.ExitCode == 134 && !resp.Forced {
		resp.Detail += " (llama-server exits 134 after SIGTERM)"
	}
	return resp, err
}

// publicRoutes are the routes llama-server answers without its key
// (get_public_endpoints in tools/server/server-http.cpp; older builds add
// /api/tags), besides the web UI's assets, which CapyCTL turns off.
// The list is the engine table's (sdk/enginefacts).
var publicRoutes = enginefacts.Values(enginefacts.LlamaCpp.OpenRoutes)

// openRoutes are the routes a llama-server on TCP answers without the key.
func openRoutes(key string) []string {
	if key == "" {
		return enginekit.OpenToAll
	}
	return publicRoutes
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch and reports the engine running, gone or uncertain.
func (d *Driver) Recover(_ context.Context, req *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return d.reg.Recover(req, func(launched proc.Launched, detail string) (*handle, string, error) {
		l := &req.Launch
		return newHandle(req.InstanceID, l.LaunchID, launched, int(l.Port), req.EngineKey, &req.Deployment, nil, d.stopGrace), detail, nil
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
