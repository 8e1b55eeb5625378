// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// All are the faults of make faults, in the order they run.
func All() []Fault {
	return []Fault{
		KillCore(), KillDriver(), StopDriver(), StopDuringDriverStop(), KillEngine(), FullDisk(), ReadOnlyStore(),
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
	}, Expect: expect(
		// The engines ran on and were re-attached: nothing relaunched.
		allEnginesSurvive,
		// Clients saw the role gone until it listened again, and nothing
		// else: the recovered instances served at once.
		failOnly("lost connections", connectionLost),
	)}
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
		if !noteReplaced(e, old, e.Scale.Recover) {
			e.Miss("the killed driver was not replaced within %s", e.Scale.Recover)
		}
	}, Expect: expect(
		// The request path never calls a driver, and the new driver
		// recovers the engines.
		allEnginesSurvive, nothingFails,
	)}
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
					e.Miss("driver %d still alive after %s: SIGCONT", pid, e.Scale.StopFor)
				}
			}
		}()
		// A command during the stop must come back.
		out, code, took := e.CLI(30*time.Second, "status")
		e.Note("capyctl status during the stop: exit %d in %.1f s%s", code, took.Seconds(), firstLineIfFailed(code, out))
		if code != 0 {
			e.Miss("capyctl status during the stop: exit %d, want 0", code)
		}
		if !noteReplaced(e, old, min(stoppedDriverBound, e.Scale.StopFor)) {
			e.Miss("the stopped driver was not killed and replaced within %s (the default pings' bound)", min(stoppedDriverBound, e.Scale.StopFor))
		}
	}, Expect: expect(allEnginesSurvive, nothingFails)}
}

// stoppedDriverBound is when the role has replaced a stopped driver with
// the default ping settings (drivers.ping_interval and ping_timeout 5 s,
// two misses in a row): the first ping within an interval, a miss a
// timeout later, the second at once (an interval after the first began),
// its miss a timeout later; then the relaunch.
const stoppedDriverBound = 5*time.Second + 2*5*time.Second + within

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
			e.Miss("no new engine ready within %s", e.Scale.Recover)
		}
	}, Expect: expect(
		// Only the killed engine is gone: the bystander's runs on.
		func(e *Env, got Result) {
			if got.Kept != got.Of-1 || len(got.Gone) != 1 || !strings.HasPrefix(got.Gone[0], trafficDep+":") {
				e.Miss("engines survived %d/%d (%s), want every one but %s's", got.Kept, got.Of, strings.Join(got.Gone, "; "), trafficDep)
			}
		},
		// Every request the dead engine costs is answered with a code.
		failOnly("coded answers", coded),
	)}
}

// driverPIDs are the live custom-engine drivers of the role.
func driverPIDs(e *Env) []int {
	pids := harness.DriverPIDs(e.Role.StateDir, "custom")
	if len(pids) == 0 {
		e.T.Fatalf("no custom driver runs under %s", e.Role.StateDir)
	}
	return pids
}

// noteReplaced waits until the old drivers are gone and a new one runs,
// and says whether that happened within bound.
func noteReplaced(e *Env, old []int, bound time.Duration) bool {
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
		return true
	}
	e.Note("driver not replaced within %s", bound)
	return false
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
func probeDeploy(e *Env, specPath, when string) (int, string) {
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
		return code, out
	}
	e.Note("%s %s: exit %d: %s", what, when, code, firstLine(lastError(out)))
	return code, out
}

// exitStoreUnavailable is capyctl's exit code for store_unavailable (a
// write the file system refused), as core/structs/errors.go gives it.
const exitStoreUnavailable = 27

// refusedStoreUnavailable: a command the store cannot take is refused
// store_unavailable (exit 27) or, where it needed no write after all,
// carried out; anything else is a miss.
func refusedStoreUnavailable(e *Env, what string, code int, out string) {
	if code != 0 && (code != exitStoreUnavailable || !strings.Contains(out, "store_unavailable")) {
		e.Miss("%s: exit %d (%s), want 0 or %d store_unavailable", what, code, firstLine(lastError(out)), exitStoreUnavailable)
	}
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
