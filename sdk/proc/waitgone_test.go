// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestWaitGone watches a process (the test's child here; an engine is its
// shim's, which makes no difference to a pidfd): it waits while the process
// runs (its context ends first, and it says so), returns when the process
// is killed (reaped or not), and returns at once for an identity whose
// start time names another process.
func TestWaitGone(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ticks, err := ReadStartTicks(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	id := Identity{PID: cmd.Process.Pid, StartTicks: ticks}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = WaitGone(ctx, id)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitGone of a running process = %v, want its context's end", err)
	}

	if err := WaitGone(context.Background(), Identity{PID: id.PID, StartTicks: id.StartTicks + 1}); err != nil {
		t.Fatalf("WaitGone of an identity whose PID another process has = %v, want nil at once", err)
	}

	done := make(chan error, 1)
	go func() { done <- WaitGone(context.Background(), id) }()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitGone of a killed process = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitGone did not return after the process was killed (it is a zombie until reaped: gone all the same)")
	}
}
