// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// DefaultStopGrace is how long an engine may take after SIGTERM.
const DefaultStopGrace = 30 * time.Second

// lastLogLines is how many lines a failed probe carries.
const lastLogLines = 20

// Instance is one running engine the driver knows: its launch, how to reach
// it, and what the driver learned (parked tier, canary).
type Instance struct {
	// ID is "<deployment>/<index>".
	ID string
	// LaunchID identifies the launch.
	LaunchID string
	// Launched are the launch's processes.
	Launched proc.Launched
	// Port is the leased loopback port.
	Port int
	// ServedName is the model name the engine serves.
	ServedName string
	// API is "chat" or "decisions".
	API string
	// Residency is the effective residency ("deep", "host_backed",
	// "restart_only").
	Residency string
	// ModelDir is the model directory (SGLang reloads weights from it).
	ModelDir string
	// Endpoint tells the router how to reach the engine.
	Endpoint *pb.Endpoint
	// Client talks to the engine with its key.
	Client *engineapi.EngineClient
	// StopGrace is the grace period after SIGTERM.
	StopGrace time.Duration

	mu     sync.Mutex
	parked string
	canary string
}

// NewInstance builds an instance; ep.AuthHeader/AuthValue set the client's
// credentials.
func NewInstance(id, launchID string, l proc.Launched, port int, ep *pb.Endpoint) *Instance {
	return &Instance{
		ID: id, LaunchID: launchID, Launched: l, Port: port, Endpoint: ep, ServedName: ep.GetServedName(),
		Client:    engineapi.NewEngineClient(ep.GetBaseUrl(), ep.GetAuthHeader(), ep.GetAuthValue()),
		StopGrace: DefaultStopGrace,
	}
}

// BaseURL is the engine's loopback URL.
func BaseURL(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }

// Parked is the tier the instance is parked at, "" when it is not.
func (in *Instance) Parked() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.parked
}

// SetParked records the tier the instance is parked at ("" when woken).
func (in *Instance) SetParked(tier string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.parked = tier
}

// Canary is the answer to the canary prompt recorded at first readiness.
func (in *Instance) Canary() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.canary
}

// SetCanary records the first readiness answer (later ones are ignored).
func (in *Instance) SetCanary(s string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.canary == "" {
		in.canary = s
	}
}

// LaunchPB is the launch to record.
func (in *Instance) LaunchPB() *pb.Launch {
	return &pb.Launch{
		Pgid:      int32(in.Launched.Pgid),
		LaunchDir: in.Launched.LaunchDir,
		Port:      int32(in.Port),
		LaunchId:  in.LaunchID,
		Processes: []*pb.ProcessIdentity{
			{Pid: int32(in.Launched.Shim.PID), StartTicks: in.Launched.Shim.StartTicks, Role: "shim"},
			{Pid: int32(in.Launched.Engine.PID), StartTicks: in.Launched.Engine.StartTicks, Role: "engine"},
		},
	}
}

// FromLaunch rebuilds a proc.Launched from a recorded launch.
func FromLaunch(l *pb.Launch) proc.Launched {
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

// Alive reports whether the engine process runs.
func (in *Instance) Alive() bool { return proc.Alive(in.Launched.Engine) }

// exitRecordWait bounds how long ExitInfo waits for the shim to record
// the exit of an engine that is already gone. It returns as soon as the
// shim has; the bound only matters for a shim that hangs, and is generous
// because a loaded machine may take a while to run the shim.
const exitRecordWait = 10 * time.Second

// ExitInfo describes a launch whose engine is gone: exit code and the
// engine's last log lines. The shim records the exit a moment after the
// process dies (and copies its last output): until it has, or is gone
// itself, the status is read again (proc.WaitExitStatus).
func (in *Instance) ExitInfo(detail string) *pb.ProbeResponse {
	return &pb.ProbeResponse{
		Alive: false, Exited: true, ExitCode: int32(exitCode(in.Launched.LaunchDir)), Code: sdk.CodeLaunchFailed, Detail: detail,
		LastLogLines: proc.LastLines(in.Launched.LaunchDir, lastLogLines),
	}
}

// exitCode waits for the launch's recorded exit status; -1 when none comes.
func exitCode(launchDir string) int {
	if st, err := proc.WaitExitStatus(launchDir, exitRecordWait); err == nil && st.Exited {
		return st.ExitCode
	}
	return -1
}

// Liveness answers a LIVENESS probe from the process table.
func (in *Instance) Liveness() *pb.ProbeResponse {
	if !in.Alive() {
		return in.ExitInfo("the engine process is gone")
	}
	return &pb.ProbeResponse{Alive: true, Endpoint: in.Endpoint}
}

// Registry is the driver's instances by ID.
type Registry struct {
	mu sync.Mutex
	m  map[string]*Instance
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]*Instance{}} }

// Get returns an instance or instance_not_found.
func (r *Registry) Get(id string) (*Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.m[id]
	if !ok {
		return nil, sdk.Errorf(sdk.CodeInstanceNotFound, "no instance %s on this driver", id)
	}
	return in, nil
}

// Put records an instance, replacing one with the same ID.
func (r *Registry) Put(in *Instance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[in.ID] = in
}

// Drop forgets an instance.
func (r *Registry) Drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// LaunchOptions is what StartLaunch needs.
type LaunchOptions struct {
	// Plan is the rendered launch.
	Plan *pb.PlanResponse
	// Host is the host's policy (log mode).
	Host *pb.HostPolicy
	// Launch is the launch context (port, launch directory).
	Launch *pb.LaunchContext
	// SecretEnv are environment entries that carry secrets (the key).
	SecretEnv map[string]string
	// Secrets are values redacted from the engine's output.
	Secrets []string
}

// StartLaunch runs a plan behind the shim: the leased port must be free,
// the environment is the plan's plus the secret entries, and the output is
// kept in memory only when the host keeps engine logs in memory or retains
// nothing.
func StartLaunch(o LaunchOptions) (*proc.Launched, error) {
	lctx := o.Launch
	if lctx.GetPort() <= 0 || lctx.GetLaunchDir() == "" {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "start needs a leased port and a launch directory")
	}
	if len(o.Plan.GetArgv()) == 0 {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "the plan has no command")
	}
	if !proc.PortFree(int(lctx.GetPort())) {
		return nil, sdk.Errorf("port_conflict", "another process listens on the leased port %d", lctx.GetPort())
	}
	env := map[string]string{}
	for k, v := range o.Plan.GetEnv() {
		env[k] = v
	}
	for k, v := range o.SecretEnv {
		env[k] = v
	}
	var secrets []string
	for _, s := range o.Secrets {
		if s != "" {
			secrets = append(secrets, s)
		}
	}
	launched, err := proc.Start(proc.LaunchSpec{
		Argv:        o.Plan.GetArgv(),
		Env:         env,
		Dir:         o.Plan.GetWorkdir(),
		LaunchDir:   lctx.GetLaunchDir(),
		LogMode:     LogMode(o.Host),
		Secrets:     secrets,
		NoCoreDumps: o.Host.GetRetention() == "zero",
	})
	if err != nil {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "%v", err)
	}
	return launched, nil
}

// LogMode is proc's log mode for a host: memory when the host keeps engine
// logs in memory or retains nothing.
func LogMode(h *pb.HostPolicy) string {
	if h.GetEngineLogs() == "memory" || h.GetRetention() == "zero" {
		return proc.LogModeMemory
	}
	return proc.LogModeFile
}

// StopLaunch ends a launch's whole group and proves it gone.
func StopLaunch(l proc.Launched, grace time.Duration) *pb.StopResponse {
	res, err := proc.Stop(l, grace)
	if err != nil {
		return &pb.StopResponse{Gone: res.Gone, Forced: res.Forced, ExitCode: -1, Detail: err.Error()}
	}
	return &pb.StopResponse{Gone: res.Gone, Forced: res.Forced, ExitCode: int32(res.ExitCode), Detail: res.Detail}
}

// RecoverLaunch decides from a recorded launch whether its engine runs:
// RUNNING when the engine's identity is alive, GONE when nothing of the
// launch is left, UNCERTAIN when the engine is gone but its group still has
// processes.
func RecoverLaunch(l *pb.Launch) (proc.Launched, pb.RecoverState, string) {
	if l == nil {
		return proc.Launched{}, pb.RecoverState_RECOVER_STATE_GONE, "no launch recorded"
	}
	launched := FromLaunch(l)
	if launched.Engine.PID == 0 && l.GetLaunchDir() != "" {
		// The core died between the spawn and recording the identities:
		// the shim wrote them in the launch directory.
		if fromDir, err := proc.ReadLaunched(l.GetLaunchDir()); err == nil {
			launched = fromDir
		}
	}
	if proc.Alive(launched.Engine) {
		return launched, pb.RecoverState_RECOVER_STATE_RUNNING, "re-attached from the recorded launch"
	}
	if len(proc.GroupPIDs(launched.Pgid)) > 0 && proc.Alive(launched.Shim) {
		return launched, pb.RecoverState_RECOVER_STATE_UNCERTAIN, "the engine is gone but its group still has processes"
	}
	return launched, pb.RecoverState_RECOVER_STATE_GONE, "the engine process is gone"
}

// Logs returns the redacted tail of a launch's output.
func Logs(dir string, maxBytes int64) *pb.LogsResponse {
	n := int(maxBytes)
	if n <= 0 {
		n = 64 << 10
	}
	text, trunc, err := proc.Tail(dir, n)
	if err != nil {
		return &pb.LogsResponse{}
	}
	return &pb.LogsResponse{Text: strings.TrimRight(text, "\n") + "\n", Truncated: trunc}
}

// OffLoopback returns a non-loopback address the group listens on, "" if
// none.
func OffLoopback(pgid int) string {
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

// ReadyFunc runs the readiness checks once: ready, the canary answer, or
// what is still missing.
type ReadyFunc func(ctx context.Context) (ready bool, canary, why string)

// WatchFunc looks for a launch that failed while its main process lives
// (SGLang's scheduler dying); it returns a detail when it did.
type WatchFunc func() (failed bool, detail string)

// WaitReady polls finely (5 ms, growing to 250 ms) until ready says so, the
// engine exits, watch reports a failure, the group listens off loopback,
// or the deadline passes. On a failure seen by watch, fail runs (to end the
// launch and clean up) before the answer is returned.
func (in *Instance) WaitReady(ctx context.Context, deadline time.Duration, ready ReadyFunc, watch WatchFunc, fail func()) *pb.ProbeResponse {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	why := "starting"
	var out *pb.ProbeResponse
	_ = engineapi.Poll(ctx, func(ctx context.Context) (bool, error) {
		if !in.Alive() {
			out = in.ExitInfo("the engine exited while " + why)
			return true, nil
		}
		if watch != nil {
			if failed, detail := watch(); failed {
				lines := proc.LastLines(in.Launched.LaunchDir, lastLogLines)
				if fail != nil {
					fail()
				}
				out = &pb.ProbeResponse{Exited: true, ExitCode: int32(exitCode(in.Launched.LaunchDir)), Code: sdk.CodeLaunchFailed, Detail: detail, LastLogLines: lines}
				return true, nil
			}
		}
		if bad := OffLoopback(in.Launched.Pgid); bad != "" {
			lines := proc.LastLines(in.Launched.LaunchDir, lastLogLines)
			_, _ = proc.Stop(in.Launched, in.StopGrace)
			out = &pb.ProbeResponse{Exited: true, ExitCode: -1, Code: sdk.CodeOffLoopback,
				Detail: fmt.Sprintf("the engine listened on %s, not only on loopback; it was stopped", bad), LastLogLines: lines}
			return true, nil
		}
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		ok, canary, w := ready(rctx)
		rcancel()
		if ok {
			in.SetCanary(canary)
			out = &pb.ProbeResponse{Alive: true, Ready: true, Endpoint: in.Endpoint, Canary: canary}
			return true, nil
		}
		why = w
		return false, nil
	})
	if out != nil {
		return out
	}
	return &pb.ProbeResponse{
		Alive: in.Alive(), Code: sdk.CodeStartupTimeout,
		Detail:       fmt.Sprintf("not ready within %s (last: %s)", deadline, why),
		LastLogLines: proc.LastLines(in.Launched.LaunchDir, lastLogLines),
	}
}

// ChatReady is the usual ReadyFunc of a chat engine: the served name in
// /v1/models, then a real short answer to the canary prompt (content or
// reasoning both count). extra fields are merged into the request.
func (in *Instance) ChatReady(prompt string, maxTokens int, extra map[string]any) ReadyFunc {
	return func(ctx context.Context) (bool, string, string) {
		found, err := engineapi.ModelsContain(ctx, in.Client, in.ServedName)
		if err != nil {
			return false, "", "waiting for the model list: " + err.Error()
		}
		if !found {
			return false, "", "waiting for " + in.ServedName + " in " + engineapi.ModelsPath
		}
		answer, err := engineapi.ChatProbeExtra(ctx, in.Client, in.Endpoint.GetChatPath(), in.ServedName, prompt, maxTokens, extra)
		if err != nil {
			return false, "", "waiting for a first answer: " + err.Error()
		}
		return true, answer, ""
	}
}

// parkedFile in a launch directory records the tier the engine is parked
// at, so that a restarted driver knows (SGLang has no route that says).
const parkedFile = "capyctl-parked"

// MarkParked records in the launch directory that the engine is parked at
// tier ("" clears it), and keeps it on the instance.
func (in *Instance) MarkParked(tier string) {
	in.SetParked(tier)
	p := filepath.Join(in.Launched.LaunchDir, parkedFile)
	if in.Launched.LaunchDir == "" {
		return
	}
	if tier == "" {
		_ = os.Remove(p)
		return
	}
	_ = os.WriteFile(p, []byte(tier), 0o600)
}

// RecordedPark returns the tier a launch directory records the engine
// parked at, "" when none.
func RecordedPark(launchDir string) string {
	if launchDir == "" {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(launchDir, parkedFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
