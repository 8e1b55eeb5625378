// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package drivers_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/freeze"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk/proc"
)

// A driver stopped with SIGSTOP neither hangs a command nor another
// family's start, and is replaced while its engine keeps serving.
func TestDrivers_StoppedDriverIsReplaced(t *testing.T) {
	// A short call deadline; pings slow enough that the call below meets
	// the stopped driver, not its replacement: the driver is killed after
	// two missed pings in a row, at least 6 s after the stop (each ping
	// waits 3 s, one at a time), against about 1 s for the call. The
	// defaults (5 s and 5 s) would keep the test waiting 15 s.
	r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{Args: []string{
		"--set", "drivers.call_timeout=1s",
		"--set", "drivers.ping_interval=2s", "--set", "drivers.ping_timeout=3s",
	}})
	r.AddFakeEngine("fake")
	r.MustDeploy("demo", harness.SimpleSpec("demo", "fake"))
	r.AddLlamaServer("llamacpp")
	r.PutModel("stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
	engine := e2e.Status(t, r, "demo").Instances[0].PID
	drivers := harness.DriverPIDs(r.StateDir, "custom")
	if len(drivers) != 1 {
		t.Fatalf("custom driver processes %v", drivers)
	}
	stopped := drivers[0]
	freeze.Process(t, stopped)
	t.Cleanup(func() { _ = syscall.Kill(stopped, syscall.SIGKILL) })

	// (a) A command that needs the stopped driver returns a coded error.
	_, errOut, code := r.CLI("engine", "flags", "custom")
	if code == 0 || !strings.Contains(errOut, "driver_timeout") {
		t.Fatalf("engine flags custom on a stopped driver: exit %d %s", code, errOut)
	}
	// (b) Another family's start proceeds.
	r.MustDeployFile("stories", storiesSpec)
	if st := e2e.Status(t, r, "stories"); st.State != "ready" {
		t.Fatalf("the llama.cpp deployment: %s", st.State)
	}
	// (c) The stopped driver is killed and a new one launched; the engine
	// kept running and is recovered by the new driver.
	harness.Eventually(t, 60*time.Second, "the stopped driver replaced", func() bool {
		now := harness.DriverPIDs(r.StateDir, "custom")
		return !harness.Alive(stopped) && len(now) == 1 && now[0] != stopped
	})
	if !harness.Alive(engine) {
		t.Fatalf("the engine %d died with its driver", engine)
	}
	harness.Eventually(t, 30*time.Second, "demo ready on its engine", func() bool {
		st := e2e.Status(t, r, "demo")
		return st.State == "ready" && st.Instances[0].PID == engine
	})
	e2e.ChatOK(t, r, "demo")
	// The new driver has the engine: a stop goes through it.
	if _, errOut, code := r.CLI("stop", "deployment", "demo", "--wait"); code != 0 {
		t.Fatalf("stop: %s", errOut)
	}
	if harness.Alive(engine) {
		t.Fatalf("engine %d still alive after stop", engine)
	}
}

// After a crash of the core, a driver that serves no instance (launched for
// `engine flags`) is re-attached and ended by the next clean stop instead of
// running on under PID 1.
func TestDrivers_NoOrphanDriverAfterCrash(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	if _, errOut, code := r.CLI("engine", "flags", "vllm"); code != 0 {
		t.Fatalf("engine flags vllm: exit %d %s", code, errOut)
	}
	before := harness.DriverPIDs(r.StateDir, "vllm")
	if len(before) != 1 {
		t.Fatalf("vllm driver processes %v", before)
	}
	r.Kill9()
	r.Restart()
	r.Stop()
	if left := harness.DriverPIDs(r.StateDir, "vllm"); len(left) != 0 {
		t.Fatalf("vllm driver processes %v left after a crash, a restart and a clean stop (was %v)\n%s", left, before, r.Output())
	}
}

// The role and its drivers write no core file.
func TestDrivers_RoleAndDriversDumpNoCore(t *testing.T) {
	r := e2e.StartWithDemo(t)
	drivers := harness.DriverPIDs(r.StateDir, "custom")
	if len(drivers) != 1 {
		t.Fatalf("driver processes %v", drivers)
	}
	for name, pid := range map[string]int{"role": r.PID(), "driver": drivers[0]} {
		if f := coreLimit(t, pid); f[0] != "0" || f[1] != "0" {
			t.Errorf("%s %d: core-file limit %v, want 0 0", name, pid, f)
		}
	}
}

// coreLimit returns the soft and hard "Max core file size" of a process.
func coreLimit(t *testing.T, pid int) []string {
	t.Helper()
	soft, hard, err := proc.CoreFileLimit(pid)
	if err != nil {
		t.Fatal(err)
	}
	return []string{soft, hard}
}
