// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/decisions"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// canaryPrompt is the fixed prompt whose answer proves a chat model ready.
const canaryPrompt = "Reply with one word: ready"

// metricNames are llama-server's idle signal (--metrics; no labels).
var metricNames = pyengine.MetricNames{
	Running: "llamacpp:requests_processing",
	Waiting: "llamacpp:requests_deferred",
	KVUsage: []string{"llamacpp:kv_cache_usage_ratio"},
	Figures: []string{"llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds"},
}

// handle is one running llama-server: the shared instance handling of the
// first-party drivers, and what readiness expects of /props.
type handle struct {
	*pyengine.Instance
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

func newHandle(id, launchID string, l proc.Launched, port int, key string, dep *pb.Deployment, plan *pb.PlanResponse, grace time.Duration) *handle {
	ep := &pb.Endpoint{
		BaseUrl: pyengine.BaseURL(port), ChatPath: "/v1/chat/completions", DecisionsPath: decisions.Path,
		AbortMode: pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION, ServedName: dep.GetServedName(),
	}
	if key != "" {
		ep.AuthHeader, ep.AuthValue = "Authorization", "Bearer "+key
	}
	in := pyengine.NewInstance(id, launchID, l, port, ep)
	in.API, in.ModelDir, in.Residency, in.StopGrace = dep.GetApi(), dep.GetModelDir(), pyengine.ResidencyRestartOnly, grace
	h := &handle{Instance: in, startup: startupBase}
	if plan != nil {
		h.slots, h.slotCtx = slotsOf(plan.GetArgv())
		if t := time.Duration(plan.GetStartupTimeoutMs()) * time.Millisecond; t > 0 {
			h.startup = t
		}
	}
	return h
}

// Probe implements sdk.Driver.
func (d *Driver) Probe(ctx context.Context, req *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	h, err := d.get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	switch req.GetKind() {
	case pb.ProbeKind_PROBE_KIND_LIVENESS:
		return settled(h.Liveness(), h.Launched.LaunchDir), nil
	case pb.ProbeKind_PROBE_KIND_READINESS, pb.ProbeKind_PROBE_KIND_WAKE_CHECK:
		deadline := time.Duration(req.GetDeadlineMs()) * time.Millisecond
		if deadline <= 0 {
			deadline = h.startup
		}
		watch := func() (bool, string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.mismatch != "", h.mismatch
		}
		return settled(h.WaitReady(ctx, deadline, h.readyOnce, watch, nil), h.Launched.LaunchDir), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.GetKind())
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
	answer, err := engineapi.ChatProbe(ctx, c, h.Endpoint.GetChatPath(), h.ServedName, canaryPrompt, 8)
	if err != nil {
		return false, "", "waiting for a first answer: " + err.Error()
	}
	return true, answer, ""
}

// readinessDecision sends the fixed readiness decision and checks that the
// answer covers every label.
func (h *handle) readinessDecision(ctx context.Context) (bool, string, string) {
	req := decisions.ReadinessRequest(h.ServedName)
	var resp decisions.Response
	if _, err := h.Client.PostJSON(ctx, decisions.Path, req, &resp); err != nil {
		return false, "", "waiting for the readiness decision: " + err.Error()
	}
	if err := decisions.Check(req, &resp); err != nil {
		return false, "", "the readiness decision is incomplete: " + err.Error()
	}
	p := resp.Answers[0].Probabilities
	return true, fmt.Sprintf("yes=%.3f no=%.3f unknown=%.3f", p["yes"], p["no"], p["unknown"]), ""
}

// Load implements sdk.Driver: the idle signal is llama-server's busy slots
// (llamacpp:requests_processing) and queued tasks (requests_deferred).
func (d *Driver) Load(ctx context.Context, req *pb.LoadRequest) (*pb.LoadResponse, error) {
	h, err := d.get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	return pyengine.ReadLoad(ctx, h.Client, h.ServedName, metricNames), nil
}

// Stop implements sdk.Driver: SIGTERM to the group, SIGKILL after the
// grace, proof that every process is gone. llama-server's exit status
// after SIGTERM is 134 (it aborts on its way out); that is a clean stop.
func (d *Driver) Stop(_ context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	grace := d.stopGrace
	if req.GetGraceMs() > 0 {
		grace = time.Duration(req.GetGraceMs()) * time.Millisecond
	}
	h, herr := d.get(req.GetInstanceId())
	var resp *pb.StopResponse
	switch {
	case herr == nil:
		resp = pyengine.StopLaunch(h.Launched, grace)
	case req.GetLaunch() != nil:
		resp = pyengine.StopLaunch(pyengine.FromLaunch(req.GetLaunch()), grace)
	default:
		return nil, herr
	}
	if resp.GetGone() {
		if herr == nil {
			h.Client.CloseIdleConnections()
		}
		d.drop(req.GetInstanceId())
	}
	if resp.GetExitCode() == 134 && !resp.GetForced() {
		resp.Detail += " (llama-server exits 134 after SIGTERM)"
	}
	return resp, nil
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch and reports the engine running, gone or uncertain.
func (d *Driver) Recover(_ context.Context, req *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	id := req.GetInstanceId()
	if h, err := d.get(id); err == nil {
		if h.Alive() {
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: h.Endpoint, Launch: h.LaunchPB(), Detail: "handle kept by this driver"}, nil
		}
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "the engine process is gone"}, nil
	}
	launched, state, detail := pyengine.RecoverLaunch(req.GetLaunch())
	if state != pb.RecoverState_RECOVER_STATE_RUNNING {
		return &pb.RecoverResponse{State: state, Detail: detail}, nil
	}
	l := req.GetLaunch()
	h := newHandle(id, l.GetLaunchId(), launched, int(l.GetPort()), req.GetEngineKey(), req.GetDeployment(), nil, d.stopGrace)
	d.put(h)
	return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: h.Endpoint, Launch: h.LaunchPB(), Detail: detail}, nil
}

// Logs implements sdk.Driver.
func (d *Driver) Logs(_ context.Context, req *pb.LogsRequest) (*pb.LogsResponse, error) {
	dir := req.GetLaunchDir()
	if h, err := d.get(req.GetInstanceId()); err == nil {
		dir = h.Launched.LaunchDir
	}
	if dir == "" {
		return nil, sdk.Errorf(sdk.CodeInstanceNotFound, "no launch directory for %s", req.GetInstanceId())
	}
	return pyengine.Logs(dir, req.GetMaxBytes()), nil
}

// settled completes the answer about an engine that exited: its status is
// recorded by the launch shim a moment after the process dies, so an exit
// code of -1 is read again, for at most two seconds, with the log lines
// written meanwhile. (A workaround kept here: the shared
// pyengine.Instance.ExitInfo reads the status once.)
func settled(p *pb.ProbeResponse, launchDir string) *pb.ProbeResponse {
	if !p.GetExited() || p.GetExitCode() != -1 || launchDir == "" {
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = engineapi.Poll(ctx, func(context.Context) (bool, error) {
		st, err := proc.ReadStatus(launchDir)
		if err == nil && st.Exited || errors.Is(err, proc.ErrNoStatus) {
			if st.Exited {
				p.ExitCode = int32(st.ExitCode)
			}
			p.LastLogLines = proc.LastLines(launchDir, 20)
			return true, nil
		}
		return false, nil
	})
	return p
}
