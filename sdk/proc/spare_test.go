// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"syscall"
	"testing"
	"time"
)

// spareOf returns the spare shim waiting for exe's next launch, once the
// refill after a launch has started it.
func spareOf(t *testing.T, exe string) *shimProc {
	t.Helper()
	var sh *shimProc
	eventually(t, "a spare shim", func() bool {
		spares.mu.Lock()
		defer spares.mu.Unlock()
		sh = spares.by[exe]
		return sh != nil
	})
	return sh
}

// TestStart_SpareShim: after a launch a shim waits for the next one, and
// the next launch runs under it; a spare that died is replaced and the
// launch still succeeds.
func TestStart_SpareShim(t *testing.T) {
	old := refillDelay
	refillDelay = 0
	t.Cleanup(func() { refillDelay = old })
	exe := testExe(t)
	startEngine(t, engineSpec(t, "listen", nil))
	spare := spareOf(t, exe)
	second := startEngine(t, engineSpec(t, "listen", nil))
	if second.Shim.PID != spare.cmd.Process.Pid {
		t.Fatalf("the second launch's shim is %d, not the spare %d", second.Shim.PID, spare.cmd.Process.Pid)
	}
	if st, err := ReadStatus(second.LaunchDir); err != nil || !st.Running {
		t.Fatalf("status %+v, %v", st, err)
	}

	// The next spare is killed while it waits: the launch still runs.
	dead := spareOf(t, exe)
	_ = syscall.Kill(dead.cmd.Process.Pid, syscall.SIGKILL)
	<-dead.waited
	third := startEngine(t, engineSpec(t, "listen", nil))
	if third.Shim.PID == dead.cmd.Process.Pid {
		t.Fatal("the launch went to the dead spare")
	}
	if st, err := ReadStatus(third.LaunchDir); err != nil || !st.Running {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// TestCloseSpares: a driver that ends closes its spare shim and waits for
// it, so that no process of the driver's outlives it; no spare is started
// after that, even by a launch's refill still to come.
func TestCloseSpares(t *testing.T) {
	old := refillDelay
	refillDelay = 0
	t.Cleanup(func() {
		refillDelay = old
		spares.mu.Lock()
		spares.closed = false
		spares.mu.Unlock()
	})
	exe := testExe(t)
	startEngine(t, engineSpec(t, "listen", nil))
	spare := spareOf(t, exe)
	CloseSpares(10 * time.Second)
	select {
	case <-spare.waited:
	default:
		t.Fatal("CloseSpares returned while the spare shim still ran")
	}
	refillSpare(exe)
	spares.mu.Lock()
	left := spares.by[exe]
	spares.mu.Unlock()
	if left != nil {
		t.Fatal("a spare was started after CloseSpares")
	}
}
