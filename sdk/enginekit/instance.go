// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
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
	// LMCachePort is the port of the instance's LMCache server, 0 for none.
	LMCachePort int
	// LMCacheServer is the instance's LMCache server the engine connects
	// to (a launch of its own: StartLMCacheServer), nil for none.
	LMCacheServer *sdk.Launch
	// ServedName is the model name the engine serves.
	ServedName string
	// API is "chat", "decisions", "embeddings" or "rerank".
	API string
	// Residency is the effective residency ("deep", "host_backed",
	// "restart_only").
	Residency string
	// ModelDir is the model directory (SGLang reloads weights from it).
	ModelDir string
	// Endpoint tells the router how to reach the engine.
	Endpoint *sdk.Endpoint
	// Client talks to the engine with its key.
	Client *engineapi.EngineClient
	// StopGrace is the grace period after SIGTERM.
	StopGrace time.Duration
	// Group is the launch's group membership (Deployment.group), nil for a
	// launch of its own. A worker (rank above 0) serves no inference: its
	// readiness is its process, its park, wake, abort and load call
	// nothing, and its rendezvous and collective sockets may listen off
	// loopback (on its peer address or every address, never on its port).
	Group *sdk.Group

	mu     sync.Mutex
	parked string
	canary string

	// members follows the launch's group between listener checks
	// (offLoopbackAddr), so that each after the first reads only what
	// changed in /proc.
	membersMu   sync.Mutex
	members     *proc.Group
	membersPgid int // the process group members follows
}

// NewInstance builds an instance; ep.AuthHeader/AuthValue set the client's
// credentials. A nil ep is an empty endpoint.
func NewInstance(id, launchID string, l proc.Launched, port int, ep *sdk.Endpoint) *Instance {
	if ep == nil {
		ep = &sdk.Endpoint{}
	}
	return &Instance{
		ID: id, LaunchID: launchID, Launched: l, Port: port, Endpoint: ep, ServedName: ep.ServedName,
		Client:    engineapi.NewEngineClient(ep.BaseURL, ep.AuthHeader, ep.AuthValue),
		StopGrace: DefaultStopGrace,
	}
}

// Worker reports whether the instance is a group's worker rank.
func (in *Instance) Worker() bool { return GroupWorker(in.Group) }

// Base returns the instance itself: a driver's handle that embeds an
// Instance is a Handle through it.
func (in *Instance) Base() *Instance { return in }

// BaseURL is the engine's loopback URL.
func BaseURL(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }

// ChatPath is the OpenAI-compatible chat route the engines serve.
const ChatPath = "/v1/chat/completions"

// NewEndpoint is how the router reaches an engine on its loopback port:
// chat at ChatPath, a request ended by closing its connection, a
// non-streamed request streamed from the engine (the safe choice: see
// pb.NonStreamedHangup), and the per-launch key, when there is one, as a
// bearer token. A driver sets what its engine does otherwise (decisions, a
// request ID, an abort by ID, a non-streamed request stopped on hang-up).
func NewEndpoint(port int, served, key string) *sdk.Endpoint {
	ep := &sdk.Endpoint{
		BaseURL:           BaseURL(port),
		ChatPath:          ChatPath,
		AbortMode:         sdk.AbortModeCloseConnection,
		NonStreamedHangup: sdk.NonStreamedHangupStream,
		ServedName:        served,
	}
	if key != "" {
		ep.AuthHeader = "Authorization"
		ep.AuthValue = "Bearer " + key
	}
	return ep
}

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

// LaunchRecord is the launch to record.
func (in *Instance) LaunchRecord() *sdk.Launch {
	l := &sdk.Launch{
		Pgid:        int32(in.Launched.Pgid),
		LaunchDir:   in.Launched.LaunchDir,
		Port:        int32(in.Port),
		LaunchID:    in.LaunchID,
		LMCachePort: int32(in.LMCachePort),
		Processes: []*sdk.ProcessIdentity{
			{Pid: int32(in.Launched.Shim.PID), StartTicks: in.Launched.Shim.StartTicks, Role: "shim"},
			{Pid: int32(in.Launched.Engine.PID), StartTicks: in.Launched.Engine.StartTicks, Role: "engine"},
		},
	}
	return l
}

// FromLaunch rebuilds a proc.Launched from a recorded launch.
func FromLaunch(l *sdk.Launch) proc.Launched {
	if l == nil {
		return proc.Launched{}
	}
	out := proc.Launched{Pgid: int(l.Pgid), LaunchDir: l.LaunchDir}
	for _, p := range l.Processes {
		id := proc.Identity{PID: int(p.Pid), StartTicks: p.StartTicks}
		switch p.Role {
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
func (in *Instance) ExitInfo(detail string) *sdk.ProbeResponse {
	code := -1
	if !in.Alive() {
		// No record comes while the engine runs: wait for one only
		// once it is gone.
		code = exitCode(in.Launched.LaunchDir)
	}
	return &sdk.ProbeResponse{
		Alive: false, Exited: true, ExitCode: int32(code), Code: sdk.CodeLaunchFailed, Detail: detail,
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

// WaitExit blocks until the engine process is gone, then says how it ended
// (what Liveness says of a dead engine); it returns ctx's error when the
// core stops watching first. It waits on the kernel's word
// (proc.WaitGone), not by polling.
func (in *Instance) WaitExit(ctx context.Context) (*sdk.ExitEvent, error) {
	if err := proc.WaitGone(ctx, in.Launched.Engine); err != nil {
		return nil, err
	}
	info := in.ExitInfo("the engine process is gone")
	return &sdk.ExitEvent{Exited: true, ExitCode: info.ExitCode, Detail: info.Detail, LastLogLines: info.LastLogLines}, nil
}

// Liveness answers a LIVENESS probe from the process table.
func (in *Instance) Liveness() *sdk.ProbeResponse {
	if !in.Alive() {
		return in.ExitInfo("the engine process is gone")
	}
	return &sdk.ProbeResponse{Alive: true, Endpoint: *in.Endpoint}
}

// WakeCheck answers a WAKE_CHECK probe of an engine that parks: the canary
// asked once, its answer for the core to compare with the one recorded at
// first readiness.
func (in *Instance) WakeCheck(ctx context.Context, canary func(context.Context) (string, error)) *sdk.ProbeResponse {
	if !in.Alive() {
		return in.ExitInfo("the engine process is gone")
	}
	answer, err := canary(ctx)
	if err != nil {
		return &sdk.ProbeResponse{Alive: true, Detail: err.Error(), Code: sdk.CodeWakeFailed}
	}
	return &sdk.ProbeResponse{Alive: true, Ready: true, Canary: answer, Endpoint: *in.Endpoint}
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
