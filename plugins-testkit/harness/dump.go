// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"syscall"
	"time"
)

// QuitWithStacks sends the role SIGQUIT, on which the Go runtime prints
// every goroutine's stack to stderr (the role's Output) and exits, and
// waits for the exit up to timeout. It reports whether the role exited;
// one that did not is killed. For a failure report: what every goroutine
// of a role that hangs was waiting for.
func (r *Role) QuitWithStacks(timeout time.Duration) bool {
	if r.cmd == nil || r.cmd.Process == nil {
		return false
	}
	_ = r.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case err := <-r.waitCh:
		r.waitCh <- err
		return true
	case <-time.After(timeout):
		_ = r.cmd.Process.Kill()
		err := <-r.waitCh
		r.waitCh <- err
		return false
	}
}
