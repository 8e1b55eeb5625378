// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package freeze

import (
	"os/exec"
	"syscall"
	"testing"
)

func TestProcess_EveryThreadStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if Stopped(pid) {
		t.Fatal("a sleeping process reads stopped before any SIGSTOP")
	}
	Process(t, pid)
	if !Stopped(pid) {
		t.Fatal("Process returned before the process read stopped")
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

func TestStoppedState_ReadsPastTheCommand(t *testing.T) {
	for stat, want := range map[string]bool{
		"12 (pm.test) T 1 2":      true,
		"12 (odd) name) t 1 2":    true,
		"12 (a ) T b) S 1 2":      false,
		"12 (pm.test) R 1 2":      false,
		"12 (pm.test)":            false,
		"garbage without a paren": false,
	} {
		if got := stoppedState(stat); got != want {
			t.Errorf("stoppedState(%q) = %v, want %v", stat, got, want)
		}
	}
}
