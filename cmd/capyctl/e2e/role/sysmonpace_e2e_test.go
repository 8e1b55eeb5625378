// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/cmd/capyctl/internal/sysmonpace"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestSysmonPace_TheRoleRunsWithItItsChildrenWithout: a role's process is
// the binary re-executed with the runtime's schedtrace setting (its
// environment at exec shows it; the test fails when Settle does not
// re-execute), and neither its driver nor the engine carries the setting
// or the marker. (Drivers and engines get environments of their own
// making; that the role puts GODEBUG back for anything else it starts is
// TestRestore_PutsGODEBUGBackAsItWas's.)
func TestSysmonPace_TheRoleRunsWithItItsChildrenWithout(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("one processor for Go here: the role keeps the runtime's default")
	}
	r := e2e.StartWithDemo(t)
	e2e.ChatOK(t, r, "demo")
	if env := environ(t, r.PID()); !bytes.Contains(env, []byte(sysmonpace.Setting)) {
		t.Fatalf("the role's environment at exec has no %s: it was not re-executed\n%s", sysmonpace.Setting, env)
	}
	// Still known by its binary's name, not /proc/self/exe's "exe".
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", r.PID())); err != nil || string(bytes.TrimSpace(comm)) != "capyctl" {
		t.Fatalf("the role's process is named %q (%v), want capyctl", comm, err)
	}
	drivers := harness.DriverPIDs(r.StateDir, "custom")
	if len(drivers) == 0 {
		t.Fatal("no driver process")
	}
	children := map[string]int{"driver": drivers[0], "engine": e2e.Status(t, r, "demo").Instances[0].PID}
	for name, pid := range children {
		env := environ(t, pid)
		for _, bad := range []string{"schedtrace", "CAPYCTL_GODEBUG_BEFORE_SYSMONPACE"} {
			if bytes.Contains(env, []byte(bad)) {
				t.Errorf("the %s (pid %d) inherited %s", name, pid, bad)
			}
		}
	}
}

// environ is a process's environment as it was at its exec.
func environ(t *testing.T, pid int) []byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
