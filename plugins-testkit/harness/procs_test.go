// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"os/exec"
	"testing"
)

func TestParentPID_ReadsTheParent(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if got := parentPID(cmd.Process.Pid); got != os.Getpid() {
		t.Fatalf("parentPID(child) = %d, want %d", got, os.Getpid())
	}
	if got := parentPID(1 << 30); got != 0 {
		t.Fatalf("parentPID(no such process) = %d, want 0", got)
	}
}
