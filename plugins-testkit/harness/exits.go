// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// WaitExit waits until the role exits by itself (within timeout) and
// returns its exit code; a role still running then fails the test.
func (r *Role) WaitExit(timeout time.Duration) int {
	r.t.Helper()
	select {
	case err := <-r.waitCh:
		r.waitCh <- err
		return exitCode(err)
	case <-time.After(timeout):
		r.t.Fatalf("role did not exit within %s\n%s", timeout, r.Output())
		return -1
	}
}

// RestartExpectingFailure starts the role again on its state directory,
// with its arguments, and expects it to refuse to start: it returns the
// exit code and what the role printed. A role that comes up instead fails
// the test (and is killed).
func (r *Role) RestartExpectingFailure() (int, string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.Bin, r.startArgs()...)
	cmd.Env = append(baseEnv(), r.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &ee) {
		r.t.Fatalf("%s did not refuse to start (err %v)\n%s", r.RoleName, err, out.String())
	}
	return ee.ExitCode(), out.String()
}

// exitCode is a finished process's exit code (0 for nil).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
