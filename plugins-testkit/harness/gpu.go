// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// SimGPU shapes the simulated GPU of a role started by StartSimulated.
type SimGPU struct {
	// Devices is the number of discrete cards (default 1).
	Devices int
	// DeviceMemory is each card's memory, as a size (default "24GiB").
	DeviceMemory string
	// Unified simulates one unified memory pool instead of cards.
	Unified bool
	// SystemLimit and SystemReserve set memory.system.managed_limit and
	// free_reserve (default "2GiB" and "512MiB", so that host RAM never
	// decides a test by accident of the machine's size).
	SystemLimit   string
	SystemReserve string
}

// SimArgs returns the `start standalone` arguments of a simulated GPU.
func (g SimGPU) SimArgs() []string {
	if g.Devices == 0 {
		g.Devices = 1
	}
	if g.DeviceMemory == "" {
		g.DeviceMemory = "24GiB"
	}
	if g.SystemLimit == "" {
		g.SystemLimit = "2GiB"
	}
	if g.SystemReserve == "" {
		g.SystemReserve = "512MiB"
	}
	return []string{
		"--gpu-provider", "simulated",
		"--set", fmt.Sprintf("gpu.sim_devices=%d", g.Devices),
		"--set", "gpu.sim_device_memory=" + g.DeviceMemory,
		"--set", fmt.Sprintf("gpu.sim_unified=%t", g.Unified),
		"--set", "memory.system.managed_limit=" + g.SystemLimit,
		"--set", "memory.system.free_reserve=" + g.SystemReserve,
	}
}

// StartSimulated starts a standalone role on a simulated GPU whose state
// file lives in the role's state directory (simgpu.json); the role hands
// its path to every engine (CAPYCTL_SIMGPU_STATE).
func StartSimulated(t testing.TB, g SimGPU, opts Options) *Role {
	t.Helper()
	opts.Args = append(g.SimArgs(), opts.Args...)
	return StartStandalone(t, opts)
}

// SimStatePath is the simulated GPU's state file of a role started by
// StartSimulated.
func (r *Role) SimStatePath() string { return filepath.Join(r.StateDir, "simgpu.json") }

// SimState reads the simulated GPU: its devices and what live processes
// hold on them.
func (r *Role) SimState() simgpu.State {
	r.t.Helper()
	g, err := simgpu.Open(r.SimStatePath())
	if err != nil {
		r.t.Fatalf("open the simulated gpu: %v", err)
	}
	st, err := g.Snapshot()
	if err != nil {
		r.t.Fatalf("read the simulated gpu: %v", err)
	}
	return st
}

// StartRoleExpectingFailure runs `capyctl start standalone` with args on a
// fresh state directory and expects it to refuse to start: it returns the
// exit code and what the role printed. A role that comes up instead fails
// the test (and is killed).
func StartRoleExpectingFailure(t testing.TB, args ...string) (int, string) {
	t.Helper()
	bin, _ := Binaries(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"start", "standalone", "--state-dir", dir,
		"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0",
		"--models-root", filepath.Join(dir, "models")}, args...)
	cmd := exec.CommandContext(ctx, bin, full...)
	cmd.Env = baseEnv()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	defer KillLeftovers(dir)
	var ee *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &ee) {
		t.Fatalf("capyctl start standalone %v did not refuse to start (err %v)\n%s", args, err, out.String())
	}
	return ee.ExitCode(), out.String()
}
