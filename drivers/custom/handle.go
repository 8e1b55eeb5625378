// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"context"
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

// canaryPrompt is the fixed prompt whose answer proves readiness (and, for
// engines that park, that a wake restored the same model).
const canaryPrompt = "Reply with one word: ready"

// handle is one running instance of a custom engine.
type handle struct {
	id         string
	launched   proc.Launched
	port       int
	key        string
	manifest   *Manifest
	servedName string
	api        string
	stopGrace  time.Duration

	clientOnce sync.Once
	engine     *engineapi.EngineClient
}

func (h *handle) baseURL() string { return "http://127.0.0.1:" + strconv.Itoa(h.port) }

func (h *handle) endpoint() *pb.Endpoint {
	ep := &pb.Endpoint{
		BaseUrl:       h.baseURL(),
		ChatPath:      h.manifest.ChatPath,
		DecisionsPath: h.manifest.DecisionsPath,
		AbortMode:     pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION,
		ServedName:    h.servedName,
	}
	if h.manifest.KeyEnv != "" && h.key != "" {
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
		Pgid:      int32(h.launched.Pgid),
		LaunchDir: h.launched.LaunchDir,
		Port:      int32(h.port),
		LaunchId:  launchID,
		Processes: []*pb.ProcessIdentity{
			{Pid: int32(h.launched.Shim.PID), StartTicks: h.launched.Shim.StartTicks, Role: "shim"},
			{Pid: int32(h.launched.Engine.PID), StartTicks: h.launched.Engine.StartTicks, Role: "engine"},
		},
	}
}

// exitStatusWait bounds how long exitInfo waits for the shim to record
// the exit of an engine that is already gone (it returns as soon as the
// shim has; the bound only matters for a shim that hangs).
const exitStatusWait = 10 * time.Second

// exitInfo describes a launch whose engine process is gone. The shim
// records the exit (and the last output) a moment after the process dies:
// the status is waited for, or the exit code would read -1.
func (h *handle) exitInfo(detail string) *pb.ProbeResponse {
	st, _ := proc.WaitExitStatus(h.launched.LaunchDir, exitStatusWait)
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
		return d.waitReady(ctx, h, time.Duration(req.GetDeadlineMs())*time.Millisecond)
	}
	return nil, sdk.Errorf("invalid_request", "unknown probe kind %v", req.GetKind())
}

// waitReady polls the engine finely until it serves the served name and
// answers a real request, or it exits, or it listens off loopback, or the
// deadline passes.
func (d *Driver) waitReady(ctx context.Context, h *handle, deadline time.Duration) (*pb.ProbeResponse, error) {
	if deadline <= 0 {
		deadline = h.manifest.startupTimeout()
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	c := h.client()
	interval := 5 * time.Millisecond
	stage := "starting"
	for {
		if !proc.Alive(h.launched.Engine) {
			return h.exitInfo("the engine exited while " + stage), nil
		}
		if bad := offLoopback(h.launched.Pgid); bad != "" {
			_, _ = proc.Stop(h.launched, h.stopGrace)
			return &pb.ProbeResponse{
				Alive: false, Exited: true, ExitCode: -1, Code: sdk.CodeOffLoopback,
				Detail:       fmt.Sprintf("the engine listened on %s, not only on loopback; it was stopped", bad),
				LastLogLines: proc.LastLines(h.launched.LaunchDir, 20),
			}, nil
		}
		ok, answer, why := h.readyOnce(ctx, c)
		if ok {
			// A listener may appear late: check once more before serving.
			if bad := offLoopback(h.launched.Pgid); bad != "" {
				_, _ = proc.Stop(h.launched, h.stopGrace)
				return &pb.ProbeResponse{
					Exited: true, ExitCode: -1, Code: sdk.CodeOffLoopback,
					Detail: fmt.Sprintf("the engine listened on %s, not only on loopback; it was stopped", bad),
				}, nil
			}
			return &pb.ProbeResponse{Alive: true, Ready: true, Endpoint: h.endpoint(), Canary: answer}, nil
		}
		stage = why
		select {
		case <-ctx.Done():
			return &pb.ProbeResponse{
				Alive: proc.Alive(h.launched.Engine), Code: sdk.CodeStartupTimeout,
				Detail:       fmt.Sprintf("not ready within %s (last: %s)", deadline, why),
				LastLogLines: proc.LastLines(h.launched.LaunchDir, 20),
			}, nil
		case <-time.After(interval):
		}
		if interval < 250*time.Millisecond {
			interval = interval * 3 / 2
		}
	}
}

// readyOnce runs the readiness checks once: health, the served name, and a
// real short answer (chat engines).
func (h *handle) readyOnce(ctx context.Context, c *engineapi.EngineClient) (bool, string, string) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if h.manifest.HealthPath != "" {
		resp, err := c.Get(rctx, h.manifest.HealthPath)
		if err != nil {
			return false, "", "waiting for the health check"
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, "", fmt.Sprintf("health answered %d", resp.StatusCode)
		}
	}
	found, err := engineapi.ModelsContain(rctx, c, h.servedName)
	if err != nil || !found {
		return false, "", "waiting for " + h.servedName + " in " + h.manifest.ModelsPath
	}
	if h.api == "decisions" || (h.api == "" && h.manifest.API == "decisions") {
		// A decision model is proven ready by the fixed readiness decision,
		// answered with a complete set of probabilities; never a chat.
		req := decisions.ReadinessRequest(h.servedName)
		var resp decisions.Response
		status, err := c.PostJSON(rctx, h.manifest.DecisionsPath, req, &resp)
		if err != nil {
			return false, "", fmt.Sprintf("waiting for the readiness decision: %v", err)
		}
		if status != http.StatusOK {
			return false, "", fmt.Sprintf("the readiness decision answered %d", status)
		}
		if err := decisions.Check(req, &resp); err != nil {
			return false, "", "the readiness decision is incomplete: " + err.Error()
		}
		return true, "", ""
	}
	answer, err := engineapi.ChatProbe(rctx, c, h.manifest.ChatPath, h.servedName, canaryPrompt, 8)
	if err != nil {
		return false, "", "waiting for a first answer: " + err.Error()
	}
	return true, answer, ""
}

// offLoopback returns a non-loopback listening address of the group, "" if
// none.
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

// Load implements sdk.Driver: the manifest's idle gauges.
func (d *Driver) Load(ctx context.Context, req *pb.LoadRequest) (*pb.LoadResponse, error) {
	h, err := d.get(req.GetInstanceId())
	if err != nil {
		return nil, err
	}
	idle := h.manifest.Idle
	if idle == nil {
		return &pb.LoadResponse{Known: false, KvUsage: -1}, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := h.client().Get(lctx, idle.MetricsPath)
	if err != nil {
		return &pb.LoadResponse{Known: false, KvUsage: -1}, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &pb.LoadResponse{Known: false, KvUsage: -1}, nil
	}
	// A malformed line spoils only itself: the parser keeps the good
	// samples.
	ms, _ := engineapi.ParseMetrics(resp.Body)
	out := &pb.LoadResponse{KvUsage: -1}
	running, ok := ms.Value(idle.Running, nil)
	if !ok {
		return &pb.LoadResponse{Known: false, KvUsage: -1}, nil
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
func (d *Driver) Stop(_ context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	launched, grace := proc.Launched{}, d.stopGrace
	if h, err := d.get(req.GetInstanceId()); err == nil {
		launched, grace = h.launched, h.stopGrace
	} else if l := req.GetLaunch(); l != nil {
		launched = fromLaunch(l)
	} else {
		return nil, err
	}
	if req.GetGraceMs() > 0 {
		grace = time.Duration(req.GetGraceMs()) * time.Millisecond
	}
	res, err := proc.Stop(launched, grace)
	if err != nil {
		return &pb.StopResponse{Gone: false, Detail: err.Error(), ExitCode: -1}, nil
	}
	if res.Gone {
		if h, err := d.get(req.GetInstanceId()); err == nil && h.engine != nil {
			h.engine.CloseIdleConnections()
		}
		d.drop(req.GetInstanceId())
	}
	return &pb.StopResponse{Gone: res.Gone, Forced: res.Forced, ExitCode: int32(res.ExitCode), Detail: res.Detail}, nil
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
// launch and reports the engine running or gone.
func (d *Driver) Recover(_ context.Context, req *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	id := req.GetInstanceId()
	if h, err := d.get(id); err == nil {
		if proc.Alive(h.launched.Engine) {
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: h.endpoint(), Launch: h.launchPB(req.GetLaunch().GetLaunchId()), Detail: "handle kept by this driver"}, nil
		}
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "the engine process is gone"}, nil
	}
	l := req.GetLaunch()
	if l == nil {
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "no launch recorded"}, nil
	}
	launched := fromLaunch(l)
	if launched.Engine.PID == 0 && l.GetLaunchDir() != "" {
		// The core died between the spawn and recording the identities.
		if fromDir, err := proc.ReadLaunched(l.GetLaunchDir()); err == nil {
			launched = fromDir
		}
	}
	if !proc.Alive(launched.Engine) {
		if len(proc.GroupPIDs(launched.Pgid)) > 0 && proc.Alive(launched.Shim) {
			return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_UNCERTAIN, Detail: "the engine is gone but its group still has processes"}, nil
		}
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_GONE, Detail: "the engine process is gone"}, nil
	}
	m, err := manifestFromDetails(req.GetInstallation().GetDetails())
	if err != nil {
		return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_UNCERTAIN, Detail: err.Error()}, nil
	}
	h := &handle{
		id: id, launched: launched, port: int(l.GetPort()), key: req.GetEngineKey(), manifest: m,
		servedName: req.GetDeployment().GetServedName(), api: req.GetDeployment().GetApi(), stopGrace: m.stopGrace(d.stopGrace),
	}
	d.put(h)
	return &pb.RecoverResponse{State: pb.RecoverState_RECOVER_STATE_RUNNING, Endpoint: h.endpoint(), Launch: h.launchPB(l.GetLaunchId()), Detail: "re-attached from the recorded launch"}, nil
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
		return &pb.LogsResponse{Text: "", Truncated: false}, nil
	}
	return &pb.LogsResponse{Text: strings.TrimRight(text, "\n") + "\n", Truncated: trunc}, nil
}
