// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// All are the faults of make faults, in the order they run.
func All() []Fault {
	return []Fault{
		KillCore(), KillDriver(), StopDriver(), KillEngine(), FullDisk(), ReadOnlyStore(),
		IdleConnections(), SlowBody(), BigBodies(),
	}
}

// KillCore kills the role with SIGKILL and starts it again on the same
// state directory: the engines run on and are re-attached.
func KillCore() Fault {
	return Fault{Name: "kill -9 of the core, restart", Inject: func(e *Env) {
		e.Role.Kill9()
		start := time.Now()
		e.Role.Restart()
		e.Retarget()
		e.Note("restart answered the management API after %.1f s", time.Since(start).Seconds())
	}}
}

// KillDriver kills the custom engine's driver with SIGKILL: the role
// launches a new one, which recovers the engines.
func KillDriver() Fault {
	return Fault{Name: "kill -9 of a driver", Inject: func(e *Env) {
		old := driverPIDs(e)
		for _, pid := range old {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		e.Note("killed driver %v", old)
		noteReplaced(e, old, e.Scale.Recover)
	}}
}

// StopDriver stops the custom engine's driver with SIGSTOP: the role's
// pings (drivers.ping_interval, ping_timeout: 5 s each by default) find
// it unanswering and replace it; a driver still alive at the end gets
// SIGCONT.
func StopDriver() Fault {
	return Fault{Name: "SIGSTOP of a driver", Inject: func(e *Env) {
		old := driverPIDs(e)
		for _, pid := range old {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		defer func() {
			for _, pid := range old {
				if harness.Alive(pid) {
					_ = syscall.Kill(pid, syscall.SIGCONT)
					e.Note("driver %d still alive after %s: SIGCONT", pid, e.Scale.StopFor)
				}
			}
		}()
		// A command during the stop must come back.
		out, code, took := e.CLI(30*time.Second, "status")
		e.Note("capyctl status during the stop: exit %d in %.1f s%s", code, took.Seconds(), firstLineIfFailed(code, out))
		noteReplaced(e, old, e.Scale.StopFor)
	}}
}

// KillEngine kills the traffic's engine with SIGKILL: its requests fail,
// the role sees it exit and starts a new one (on the next request or its
// own reconciling).
func KillEngine() Fault {
	return Fault{Name: "kill -9 of an engine", Inject: func(e *Env) {
		var pid int
		var id string
		for i, in := range e.Before.Instances {
			if in.Deployment == trafficDep {
				pid, id = in.PID, i
			}
		}
		if pid == 0 {
			e.T.Fatalf("no engine for %s: %+v", trafficDep, e.Before.Instances)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		e.Note("killed engine %d of %s", pid, trafficDep)
		var now int
		if waitUntil(e.Scale.Recover, func() bool {
			st, err := Observe(context.Background(), e.Role)
			if err != nil {
				return false
			}
			in := st.Instances[id]
			now = in.PID
			return in.State == "ready" && in.PID != pid && harness.Alive(in.PID)
		}) {
			e.Note("new engine %d ready after %.1f s", now, time.Since(e.Start).Seconds())
		} else {
			e.Note("no new engine within %s", e.Scale.Recover)
		}
	}}
}

// driverPIDs are the live custom-engine drivers of the role.
func driverPIDs(e *Env) []int {
	pids := harness.DriverPIDs(e.Role.StateDir, "custom")
	if len(pids) == 0 {
		e.T.Fatalf("no custom driver runs under %s", e.Role.StateDir)
	}
	return pids
}

// noteReplaced waits until the old drivers are gone and a new one runs.
func noteReplaced(e *Env, old []int, bound time.Duration) {
	var now []int
	if waitUntil(bound, func() bool {
		for _, pid := range old {
			if harness.Alive(pid) {
				return false
			}
		}
		now = harness.DriverPIDs(e.Role.StateDir, "custom")
		return len(now) > 0
	}) {
		e.Note("new driver %v after %.1f s", now, time.Since(e.Start).Seconds())
	} else {
		e.Note("driver not replaced within %s", bound)
	}
}

func firstLineIfFailed(code int, out string) string {
	if code == 0 {
		return ""
	}
	return ": " + firstLine(out)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	return s
}

// probeDeploy writes a third deployment while the fault lasts, with
// --activate --wait: its answer goes in the notes, and a deployment the
// role acknowledged must exist after the fault. The spec and model
// directory are written by prepareProbe, before the fault (a full disk
// takes no more files).
func probeDeploy(e *Env, specPath, when string) {
	out, code, took := e.CLI(60*time.Second, "deploy", "--file", specPath, "--activate", "--wait")
	what := "deploy --activate --wait of a new deployment"
	if code == 2 && strings.Contains(out, "conflict") {
		// An earlier attempt wrote the deployment but did not start it.
		what = "start --wait of the deployment an earlier deploy wrote"
		out, code, took = e.CLI(60*time.Second, "start", "deployment", "probe", "--wait")
	}
	if code == 0 {
		e.Acknowledged("probe")
		e.Note("%s %s: ok in %.1f s", what, when, took.Seconds())
		return
	}
	e.Note("%s %s: exit %d: %s", what, when, code, firstLine(lastError(out)))
}

// prepareProbe writes the probe's spec and model directory.
func prepareProbe(e *Env) string {
	e.Role.WriteFile("models/probe/README", "fake model\n")
	return e.Role.WriteFile("specs/probe.hcl", spec("probe"))
}

// lastError is the line of a CLI output that carries the error, if any.
func lastError(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(strings.ToLower(l), "error") {
			return l
		}
	}
	return out
}

var _ = fmt.Sprint
