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

// StopDuringDriverStop stops the bystander deployment while its driver is
// stopped (SIGSTOP): the stop waits on the hung driver until the role's
// pings replace it, and must then end with the bystander stopped and its
// memory given back (the fleet-trust review's L2: such a stop stayed
// "stopping" for good, charged, until an operator stopped it again). The
// bystander (ready before, as the traffic's model) is started again at the
// end.
func StopDuringDriverStop() Fault {
	return Fault{Name: "stop of a model while its driver is stopped (SIGSTOP)", Inject: func(e *Env) {
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
		start := time.Now()
		out, code, took := e.CLI(e.Scale.Recover, "stop", "deployment", bystander, "--wait")
		e.Note("stop --wait of %s with its driver stopped: exit %d after %.1f s%s", bystander, code, took.Seconds(), firstLineIfFailed(code, out))
		if !noteReplaced(e, old, min(stoppedDriverBound, e.Scale.StopFor)) {
			e.Miss("the stopped driver was not killed and replaced within %s", min(stoppedDriverBound, e.Scale.StopFor))
		}
		var state string
		var charged bool
		if waitUntil(e.Scale.Recover, func() bool {
			st, err := Observe(context.Background(), e.Role)
			if err != nil {
				return false
			}
			for _, in := range st.Instances {
				if in.Deployment == bystander {
					state, charged = in.State, len(in.Charges) > 0
					if state != "stopped" || charged {
						return false
					}
				}
			}
			return true
		}) {
			e.Note("%s stopped and its memory given back %.1f s after the stop began", bystander, time.Since(start).Seconds())
		} else {
			e.Miss("%s is %s (charged: %v) %s after its stop began, want stopped and uncharged", bystander, state, charged, e.Scale.Recover)
		}
		if out, code, _ := e.CLI(60*time.Second, "start", "deployment", bystander, "--wait"); code != 0 {
			e.Miss("start %s again: exit %d: %s", bystander, code, firstLine(out))
		}
	}, Expect: expect(
		// Only the bystander's engine, stopped and started again, is new.
		func(e *Env, got Result) {
			if got.Kept != got.Of-1 || len(got.Gone) != 1 || !strings.HasPrefix(got.Gone[0], bystander+":") {
				e.Miss("engines survived %d/%d (%s), want every one but %s's", got.Kept, got.Of, strings.Join(got.Gone, "; "), bystander)
			}
		},
		// The traffic's model never waits on a driver.
		nothingFails,
	)}
}
