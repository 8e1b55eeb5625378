// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestStart_FailedStepUndoesWhatWasTaken: a start that fails at any step
// gives back everything the steps before it took (the start slot, the
// port, the memory charge, the launch directory of a launch never recorded, the engine of a
// launch that began) and leaves the instance stopped or failed with the
// step's error.
func TestStart_FailedStepUndoesWhatWasTaken(t *testing.T) {
	cases := []struct {
		name     string
		capacity int
		setup    func(d *stubDriver)
		code     structs.Code // the instance's last error
		errCode  structs.Code // what the activation returned
		state    structs.InstanceState
		stops    int32 // the driver's Stop calls: a launch that began is proven gone
		keepDir  bool  // a recorded launch keeps its directory (its logs)
	}{
		{"plan", 10, func(d *stubDriver) { d.failPlan = structs.Errf(structs.CodeInvalidConfig, "no plan") }, structs.CodeInvalidConfig, structs.CodeInvalidConfig, structs.StateStopped, 0, false},
		{"reserve", 2, func(d *stubDriver) {}, structs.CodeCapacityBlocked, structs.CodeCapacityBlocked, structs.StateStopped, 0, false},
		// A Start that answered no identities is proven gone by Recover
		// (TestStart_FailedStartWithoutIdentities), not by a Stop.
		{"launch", 10, func(d *stubDriver) { d.failStart = errors.New("no engine") }, structs.CodeLaunchFailed, structs.CodeActivationFailed, structs.StateFailed, 0, true},
		{"probe", 10, func(d *stubDriver) { d.notReady = true }, structs.CodeLaunchFailed, structs.CodeActivationFailed, structs.StateFailed, 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.capacity, 6, 1)
			c.setup(f.drv)
			f.deploy("a")
			err := f.activate("a")
			if !structs.HasCode(err, c.errCode) {
				t.Fatalf("err = %v (%s), want %s", err, structs.AsError(err).Code, c.errCode)
			}
			if s := f.state("a"); s != c.state {
				t.Fatalf("state %s, want %s", s, c.state)
			}
			if ph := f.placer.phase("a/0"); ph != "" {
				t.Fatalf("the memory charge stayed: %q", ph)
			}
			f.cfg.Ports.mu.Lock()
			leased := len(f.cfg.Ports.leased)
			f.cfg.Ports.mu.Unlock()
			if leased != 0 {
				t.Fatalf("%d ports still leased", leased)
			}
			f.expectNothingHeld("after the failed start")
			if got := f.drv.stops.Load(); got != c.stops {
				t.Fatalf("driver stops %d, want %d", got, c.stops)
			}
			dirs, _ := filepath.Glob(filepath.Join(f.cfg.Host.StateDir, "launches", "a", "*"))
			if c.keepDir != (len(dirs) == 1) {
				t.Fatalf("launch directories %v (keep %v)", dirs, c.keepDir)
			}
			if rec := f.inst("a"); rec.LastError == nil || rec.LastError.Code != c.code {
				t.Fatalf("last error %+v, want %s", rec.LastError, c.code)
			}
			// Nothing was left taken: with the fault gone, a start succeeds.
			f.drv.mu.Lock()
			f.drv.failPlan, f.drv.failStart, f.drv.notReady = nil, nil, false
			f.drv.mu.Unlock()
			if c.capacity < 6 {
				return // the model never fits there
			}
			if err := f.activate("a"); err != nil {
				t.Fatalf("a start after the fault: %v", err)
			}
			if _, err := os.Stat(f.cfg.Host.StateDir); err != nil {
				t.Fatal(err)
			}
		})
	}
}
