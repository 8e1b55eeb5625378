// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/decisions"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// canaryPrompt is the fixed prompt whose answer proves a chat model ready.
const canaryPrompt = "Reply with one word: ready"

// Metric names of llama-server's idle signal (--metrics).
const (
	metricProcessing = "llamacpp:requests_processing"
	metricDeferred   = "llamacpp:requests_deferred"
	metricKVRatio    = "llamacpp:kv_cache_usage_ratio"
)

// handle is one running llama-server.
type handle struct {
	id         string
	launched   proc.Launched
	port       int
	key        string
	servedName string
	api        string
	// slots and slotCtx are what readiness expects /props to report (0
	// when unknown, after a re-attach without a plan).
	slots     int
	slotCtx   int64
	stopGrace time.Duration
	startup   time.Duration

	clientOnce sync.Once
	engine     *engineapi.EngineClient
}

func newHandle(id string, l proc.Launched, port int, key string, dep *pb.Deployment, plan *pb.PlanResponse, grace time.Duration) *handle {
	h := &handle{id: id, launched: l, port: port, key: key, servedName: dep.GetServedName(), api: dep.GetApi(), stopGrace: grace}
	if plan != nil {
		h.slots, h.slotCtx = slotsOf(plan.GetArgv())
		h.startup = time.Duration(plan.GetStartupTimeoutMs()) * time.Millisecond
	}
	if h.startup <= 0 {
		h.startup = startupBase
	}
	return h
}

func (h *handle) endpoint() *pb.Endpoint {
	ep := &pb.Endpoint{
		BaseUrl:       "http://127.0.0.1:" + strconv.Itoa(h.port),
		ChatPath:      "/v1/chat/completions",
		DecisionsPath: decisions.Path,
		AbortMode:     pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION,
		ServedName:    h.servedName,
	}
	if h.key != "" {
		ep.AuthHeader = "Authorization"
		ep.AuthValue = "Bearer " + h.key
	}
	return ep
}

// client returns the instance's pooled engine client.
func (h *handle) client() *engineapi.EngineClient {
	h.clientOnce.Do(func() {
		ep := h.endpoint()
		h.engine = engineapi.NewEngineClient(ep.BaseUrl, ep.AuthHeader, ep.AuthValue)
	})
	return h.engine
}

func (h *handle) launchPB(launchID string) *pb.Launch {
	return &pb.Launch{
		Pgid: int32(h.launched.Pgid), LaunchDir: h.launched.LaunchDir, Port: int32(h.port), LaunchId: launchID,
		Processes: []*pb.ProcessIdentity{
			{Pid: int32(h.launched.Shim.PID), StartTicks: h.launched.Shim.StartTicks, Role: "shim"},
			{Pid: int32(h.launched.Engine.PID), StartTicks: h.launched.Engine.StartTicks, Role: "engine"},
		},
	}
}

// exitInfo describes a launch whose engine is gone. llama-server exits
// 134 after a failed load and after a SIGTERM alike: its log says which.
func (h *handle) exitInfo(detail string) *pb.ProbeResponse {
	st, _ := proc.ReadStatus(h.launched.LaunchDir)
	code := int32(-1)
	if st.Exited {
		code = int32(st.ExitCode)
	}
	return &pb.ProbeResponse{
		Alive: false, Exited: true, ExitCode: code, Code: sdk.CodeLaunchFailed, Detail: detail,
		LastLogLines: proc.LastLines(h.launched.LaunchDir, 20),
	}
}

// Probe implements sdk.Driver.
func (d *Driver) Probe(ctx context.Context, req *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	h, err := d.get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	switch req.GetKind() {
	case pb.ProbeKind_PROBE_KIND_LIVENESS:
		if !proc.Alive(h.launched.Engine) {
			return h.exitInfo("the engine process is gone"), nil
		}
		return &pb.ProbeResponse{Alive: true, Endpoint: h.endpoint()}, nil
	case pb.ProbeKind_PROBE_KIND_READINESS, pb.ProbeKind_PROBE_KIND_WAKE_CHECK:
		return h.waitReady(ctx, time.Duration(req.GetDeadlineMs())*time.Millisecond), nil
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.GetKind())
}

// errMismatch is a readiness check that waiting cannot fix.
type errMismatch struct{ msg string }

func (e *errMismatch) Error() string { return e.msg }

// waitReady polls finely until llama-server is ready, exits, listens off
// loopback, runs other slots than planned, or the deadline passes.
func (h *handle) waitReady(ctx context.Context, deadline time.Duration) *pb.ProbeResponse {
	if deadline <= 0 {
		deadline = h.startup
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	stage := "starting"
	for interval := 5 * time.Millisecond; ; interval = engineapi.NextInterval(interval) {
		if !proc.Alive(h.launched.Engine) {
			return h.exitInfo("the engine exited while " + stage)
		}
		if bad := offLoopback(h.launched.Pgid); bad != "" {
			_, _ = proc.Stop(h.launched, h.stopGrace)
			return &pb.ProbeResponse{
				Exited: true, ExitCode: -1, Code: sdk.CodeOffLoopback,
				Detail:       fmt.Sprintf("the engine listened on %s, not only on loopback; it was stopped", bad),
				LastLogLines: proc.LastLines(h.launched.LaunchDir, 20),
			}
		}
		answer, err := h.readyOnce(ctx)
		if err == nil {
			return &pb.ProbeResponse{Alive: true, Ready: true, Endpoint: h.endpoint(), Canary: answer}
		}
		var mm *errMismatch
		if errors.As(err, &mm) {
			return &pb.ProbeResponse{Alive: true, Code: sdk.CodeLaunchFailed, Detail: mm.msg, LastLogLines: proc.LastLines(h.launched.LaunchDir, 20)}
		}
		stage = err.Error()
		select {
		case <-ctx.Done():
			return &pb.ProbeResponse{
				Alive: proc.Alive(h.launched.Engine), Code: sdk.CodeStartupTimeout,
				Detail:       fmt.Sprintf("not ready within %s (last: %s)", deadline, stage),
				LastLogLines: proc.LastLines(h.launched.LaunchDir, 20),
			}
		case <-time.After(interval):
		}
	}
}

// readyOnce runs llama.cpp's readiness checks in order: /health 200 (503
// while loading), the served name in /v1/models, the slots and window in
// /props, then a real answer: a chat reply, or for a decision model the
// readiness decision with a complete set of probabilities.
func (h *handle) readyOnce(ctx context.Context) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := h.client()
	status, err := c.GetJSON(rctx, "/health", nil)
	switch {
	case err == nil:
	case status == http.StatusServiceUnavailable:
		return "", errors.New("loading the model (/health 503)")
	default:
		return "", errors.New("waiting for /health")
	}
	found, err := engineapi.ModelsContain(rctx, c, h.servedName)
	if err != nil || !found {
		return "", fmt.Errorf("waiting for %s in /v1/models", h.servedName)
	}
	var props struct {
		TotalSlots int `json:"total_slots"`
		Default    struct {
			NCtx int64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if _, err := c.GetJSON(rctx, "/props", &props); err != nil {
		return "", fmt.Errorf("waiting for /props: %v", err)
	}
	if h.slots > 0 && props.TotalSlots != h.slots {
		return "", &errMismatch{fmt.Sprintf("llama-server runs %d slots, %d were asked for: the build does not honour --parallel", props.TotalSlots, h.slots)}
	}
	if h.slotCtx > 0 && props.Default.NCtx > 0 && props.Default.NCtx < h.slotCtx {
		return "", &errMismatch{fmt.Sprintf("llama-server gives each slot %d tokens, %d were asked for: the build does not honour --ctx-size with --no-kv-unified", props.Default.NCtx, h.slotCtx)}
	}
	if h.api == "decisions" {
		return h.readinessDecision(rctx, c)
	}
	answer, err := engineapi.ChatProbe(rctx, c, "/v1/chat/completions", h.servedName, canaryPrompt, 8)
	if err != nil {
		return "", fmt.Errorf("waiting for a first answer: %v", err)
	}
	return answer, nil
}

// readinessDecision sends the fixed readiness decision and checks the
// answer covers every label.
func (h *handle) readinessDecision(ctx context.Context, c *engineapi.EngineClient) (string, error) {
	req := decisions.ReadinessRequest(h.servedName)
	var resp decisions.Response
	if _, err := c.PostJSON(ctx, decisions.Path, req, &resp); err != nil {
		return "", fmt.Errorf("waiting for the readiness decision: %v", err)
	}
	if err := decisions.Check(req, &resp); err != nil {
		return "", fmt.Errorf("the readiness decision is incomplete: %v", err)
	}
	p := resp.Answers[0].Probabilities
	return fmt.Sprintf("yes=%.3f no=%.3f unknown=%.3f", p["yes"], p["no"], p["unknown"]), nil
}

// offLoopback returns a non-loopback listening address of the group.
func offLoopback(pgid int) string {
	addrs, err := proc.ListeningAddrs(pgid)
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if !proc.IsLoopback(a) {
			return a.String()
		}
	}
	return ""
}

// Load implements sdk.Driver: the idle signal is llama-server's busy slots
// (llamacpp:requests_processing) and queued tasks (requests_deferred).
func (d *Driver) Load(ctx context.Context, req *pb.LoadRequest) (*pb.LoadResponse, error) {
	h, err := d.get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	unknown := &pb.LoadResponse{Known: false, KvUsage: -1}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := h.client().Get(lctx, "/metrics")
	if err != nil {
		return unknown, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return unknown, nil
	}
	// A malformed line spoils only itself: the parser keeps the good ones.
	ms, _ := engineapi.ParseMetrics(resp.Body)
	running, ok1 := ms.Value(metricProcessing, nil)
	waiting, ok2 := ms.Value(metricDeferred, nil)
	if !ok1 || !ok2 {
		return unknown, nil
	}
	out := &pb.LoadResponse{Known: true, Running: int64(running), Waiting: int64(waiting), KvUsage: -1, Figures: map[string]float64{}}
	if kv, ok := ms.Value(metricKVRatio, nil); ok {
		out.KvUsage = kv
	}
	for _, name := range []string{"llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:predicted_tokens_seconds", "llamacpp:prompt_tokens_seconds"} {
		if v, ok := ms.Value(name, nil); ok {
			out.Figures[name] = v
		}
	}
	return out, nil
}

// Stop implements sdk.Driver: SIGTERM to the group, SIGKILL after the
// grace, proof that every process is gone. llama-server's exit status
// after SIGTERM is 134 (it aborts on its way out); that is a clean stop.
func (d *Driver) Stop(_ context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	launched, grace := proc.Launched{}, d.stopGrace
	h, herr := d.get(req.GetInstanceId())
	switch {
	case herr == nil:
		launched, grace = h.launched, h.stopGrace
	case req.GetLaunch() != nil:
		launched = fromLaunch(req.GetLaunch())
	default:
		return nil, herr
	}
	if req.GetGraceMs() > 0 {
		grace = time.Duration(req.GetGraceMs()) * time.Millisecond
	}
	res, err := proc.Stop(launched, grace)
	if err != nil {
		return &pb.StopResponse{Gone: false, Detail: err.Error(), ExitCode: -1}, nil
	}
	if res.Gone {
		if herr == nil && h.engine != nil {
			h.engine.CloseIdleConnections()
		}
		d.drop(req.GetInstanceId())
	}
	detail := res.Detail
	if res.ExitCode == 134 && !res.Forced {
		detail = strings.TrimSpace(detail + " (llama-server exits 134 after SIGTERM)")
	}
	return &pb.StopResponse{Gone: res.Gone, Forced: res.Forced, ExitCode: int32(res.ExitCode), Detail: detail}, nil
}

// fromLaunch rebuilds a proc.Launched from a recorded launch.
func fromLaunch(l *pb.Launch) proc.Launched {
	out := proc.Launched{Pgid: int(l.GetPgid()), LaunchDir: l.GetLaunchDir()}
	for _, p := range l.GetProcesses() {
		id := proc.Identity{PID: int(p.GetPid()), StartTicks: p.GetStartTicks()}
		switch p.GetRole() {
		case "shim":
			out.Shim = id
		case "engine":
			out.Engine = id
		}
	}
	return out
}

// Recover implements sdk.Driver: it rebuilds the handle from the recorded
// launch and reports the engine running, gone or uncertain.
func (d *Driver) Recover(_ context.Context, req *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	id := req.GetInstanceId()
	if h, err := d.get(id); err == nil {
		if proc.Alive(h.launched.Engine) {
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: h.endpoint(), Detail: "handle kept by this driver"}, nil
		}
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "the engine process is gone"}, nil
	}
	l := req.GetLaunch()
	if l == nil {
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "no launch recorded"}, nil
	}
	launched := fromLaunch(l)
	switch st, detail := proc.Inspect(launched); st {
	case proc.LaunchRunning:
	case proc.LaunchUncertain, proc.LaunchExited:
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_UNCERTAIN, Detail: detail}, nil
	default:
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: detail}, nil
	}
	h := newHandle(id, launched, int(l.GetPort()), req.GetEngineKey(), req.GetDeployment(), nil, d.stopGrace)
	d.put(h)
	return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: h.endpoint(), Detail: "re-attached from the recorded launch"}, nil
}

// Logs implements sdk.Driver.
func (d *Driver) Logs(_ context.Context, req *pb.LogsRequest) (*pb.LogsResponse, error) {
	dir := req.GetLaunchDir()
	if h, err := d.get(req.GetInstanceId()); err == nil {
		dir = h.launched.LaunchDir
	}
	if dir == "" {
		return nil, sdk.Errorf(sdk.CodeInstanceNotFound, "no launch directory for %s", req.GetInstanceId())
	}
	max := int(req.GetMaxBytes())
	if max <= 0 {
		max = 64 << 10
	}
	text, trunc, err := proc.Tail(dir, max)
	if err != nil {
		return &pb.LogsResponse{}, nil
	}
	return &pb.LogsResponse{Text: strings.TrimRight(text, "\n") + "\n", Truncated: trunc}, nil
}
