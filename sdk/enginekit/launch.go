// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"fmt"
	"strings"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// SystemPath ends every engine's PATH; an engine that is not installed in
// an environment of its own gets it alone.
const SystemPath = "/usr/local/bin:/usr/bin:/bin"

// Env is an engine's environment as a plan renders it. Its steps are
// applied in the order a driver calls them: a later one wins.
type Env map[string]string

// NewEnv starts an engine's environment: the closed PATH given and a UTF-8
// locale.
func NewEnv(path string) Env { return Env{"PATH": path, "LANG": "C.UTF-8"} }

// PinDevices pins the engine to the launch's cards, numbered in PCI bus
// order.
func (e Env) PinDevices(lctx *sdk.LaunchContext) {
	if lctx == nil {
		return
	}
	if uuids := lctx.DeviceUUIDs; len(uuids) > 0 {
		e["CUDA_VISIBLE_DEVICES"] = strings.Join(uuids, ",")
		e["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
	}
}

// NoTelemetry sets DO_NOT_TRACK=1 unless the host allows engine telemetry.
func (e Env) NoTelemetry(h *sdk.HostPolicy) {
	if TelemetryOff(h) {
		e["DO_NOT_TRACK"] = "1"
	}
}

// Merge sets every entry of m (the host's variables, a manifest's, the
// deployment's).
func (e Env) Merge(m map[string]string) {
	for k, v := range m {
		e[k] = v
	}
}

// TelemetryOff reports whether engines must not report off the host (the
// default; engine_telemetry = "allow" lifts it). A nil policy allows
// nothing.
func TelemetryOff(h *sdk.HostPolicy) bool { return h == nil || h.EngineTelemetry != "allow" }

// LaunchOptions is what StartLaunch needs.
type LaunchOptions struct {
	// Plan is the rendered launch.
	Plan *sdk.PlanResponse
	// Host is the host's policy (log mode).
	Host *sdk.HostPolicy
	// Launch is the launch context (port, launch directory).
	Launch *sdk.LaunchContext
	// SecretEnv are environment entries that carry secrets (the key).
	SecretEnv map[string]string
	// Secrets are values redacted from the engine's output.
	Secrets []string
	// Program, when set, names the program in the error of a launch that
	// fails ("launch <program>: ...").
	Program string
	// NetNamespace launches the engine in a network namespace of its own
	// (NetnsPossible: the driver runs as root); the endpoint then names
	// it (Exposure.Netns).
	NetNamespace bool
	// LMCacheServer is the instance's running LMCache server
	// (StartLMCacheServer), nil for none: with NetNamespace the engine
	// joins the server's namespace instead of getting one of its own.
	LMCacheServer *proc.Launched
}

// StartLaunch runs a plan behind the shim: the leased port must be free,
// the environment is the plan's plus the secret entries, and the output is
// kept in memory only when the host keeps engine logs in memory or retains
// nothing.
func StartLaunch(o LaunchOptions) (*proc.Launched, error) {
	lctx := o.Launch
	if lctx.Port <= 0 || lctx.LaunchDir == "" {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "start needs a leased port and a launch directory")
	}
	if len(o.Plan.Argv) == 0 {
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "the plan has no command")
	}
	if !proc.PortFree(int(lctx.Port)) {
		return nil, sdk.Errorf(CodePortConflict, "another process listens on the leased port %d", lctx.Port)
	}
	env := map[string]string{}
	for k, v := range o.Plan.Env {
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
	var join proc.Identity
	if o.LMCacheServer != nil && o.NetNamespace {
		// The engine reaches its server on 127.0.0.1 of the server's own
		// namespace, which outlives this launch.
		join = o.LMCacheServer.Engine
	}
	launched, err := proc.Start(proc.LaunchSpec{
		Argv:         o.Plan.Argv,
		Env:          env,
		Dir:          o.Plan.Workdir,
		LaunchDir:    lctx.LaunchDir,
		LogMode:      LogMode(o.Host),
		Secrets:      secrets,
		NoCoreDumps:  o.Host.Retention == "zero",
		NetNamespace: o.NetNamespace && join.PID == 0,
		JoinNetns:    join,
	})
	if err != nil {
		if o.Program != "" {
			err = fmt.Errorf("launch %s: %w", o.Program, err)
		}
		return nil, sdk.Errorf(sdk.CodeLaunchFailed, "%v", err)
	}
	return launched, nil
}

// LogMode is proc's log mode for a host: memory when the host keeps engine
// logs in memory or retains nothing.
func LogMode(h *sdk.HostPolicy) string {
	if h != nil && (h.EngineLogs == "memory" || h.Retention == "zero") {
		return proc.LogModeMemory
	}
	return proc.LogModeFile
}

// StopLaunch ends a launch's whole group and proves it gone.
func StopLaunch(l proc.Launched, grace time.Duration) *sdk.StopResponse {
	res, err := proc.Stop(l, grace)
	if err != nil {
		return &sdk.StopResponse{Gone: res.Gone, Forced: res.Forced, ExitCode: -1, Detail: err.Error()}
	}
	return &sdk.StopResponse{Gone: res.Gone, Forced: res.Forced, ExitCode: int32(res.ExitCode), Detail: res.Detail}
}

// RecoverLaunch decides from a recorded launch whether its engine runs:
// RUNNING when the engine's identity is alive, GONE when nothing of the
// launch is left, UNCERTAIN when the engine is gone but its group still has
// processes. A nil or zero launch (none recorded) is GONE.
func RecoverLaunch(l *sdk.Launch) (proc.Launched, sdk.RecoverState, string) {
	if l == nil || (l.Pgid == 0 && len(l.Processes) == 0 && l.LaunchDir == "") {
		return proc.Launched{}, sdk.RecoverStateGone, "no launch recorded"
	}
	launched := FromLaunch(l)
	if launched.Engine.PID == 0 && l.LaunchDir != "" {
		// The core died between the spawn and recording the identities:
		// the shim wrote them in the launch directory.
		if fromDir, err := proc.ReadLaunched(l.LaunchDir); err == nil {
			launched = fromDir
		}
	}
	if proc.Alive(launched.Engine) {
		return launched, sdk.RecoverStateRunning, "re-attached from the recorded launch"
	}
	if len(proc.GroupPIDs(launched.Pgid)) > 0 && proc.Alive(launched.Shim) {
		return launched, sdk.RecoverStateUncertain, "the engine is gone but its group still has processes"
	}
	return launched, sdk.RecoverStateGone, "the engine process is gone"
}

// Logs returns the redacted tail of a launch's output.
func Logs(dir string, maxBytes int64) *sdk.LogsResponse {
	n := int(maxBytes)
	if n <= 0 {
		n = 64 << 10
	}
	text, trunc, err := proc.Tail(dir, n)
	if err != nil {
		return &sdk.LogsResponse{}
	}
	return &sdk.LogsResponse{Text: strings.TrimRight(text, "\n") + "\n", Truncated: trunc}
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
