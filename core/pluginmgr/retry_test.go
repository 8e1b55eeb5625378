// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/sdk"
)

// TestManager_CallRightAfterADriverDiedIsRetriedOnTheRelaunchedOne: a call
// that is safe to repeat (Probe, Stop, Flags, ...) and meets a driver that
// has just died (killed, crashed) is sent again to the relaunched driver.
// Before, the retry asked for the driver before the dead process was
// noticed, got the same dead connection and failed again: a kill -9 of a
// driver during an engine's start failed the start at its readiness probe
// and, its clean-up failing the same way, left the engine running outside
// the ledger (found by the soak). Each round kills the driver and calls at
// once, with no supervisor to relaunch it first.
func TestManager_CallRightAfterADriverDiedIsRetriedOnTheRelaunchedOne(t *testing.T) {
	r := newRig(t)
	m := r.manager(Deadlines{}, nil)
	defer m.Shutdown(false)
	d := mustDriver(t, m, "alpha")
	for round := 0; round < 10; round++ {
		pid := m.PID("alpha")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := d.Flags(ctx, &sdk.FlagsRequest{})
		cancel()
		if err != nil {
			t.Fatalf("round %d: a call right after the driver died: %v", round+1, err)
		}
		if p := m.PID("alpha"); p == pid || p <= 0 {
			t.Fatalf("round %d: the call was answered by driver %d, the dead one was %d", round+1, p, pid)
		}
	}
}

// TestManager_AdoptEndsTheDriversNoRecordNames: a core killed between a
// driver's start and the write of its reattach record leaves a driver no
// record names. The next core adopts the recorded drivers and ends that
// one (its environment says it is this role's, launched by another
// manager). Before, it ran on for good, one more after each such crash
// (found by the soak's kill -9 of the role).
func TestManager_AdoptEndsTheDriversNoRecordNames(t *testing.T) {
	r := newRig(t)
	first := r.manager(Deadlines{}, nil)
	mustDriver(t, first, "alpha")
	mustDriver(t, first, "beta")
	stray, kept := first.PID("alpha"), first.PID("beta")
	// The first core dies (its drivers run on) before alpha's record is
	// written.
	first.Shutdown(true)
	if err := r.store.DeleteReattach("alpha"); err != nil {
		t.Fatal(err)
	}
	second := r.manager(Deadlines{}, nil)
	defer second.Shutdown(false)
	second.AdoptRecorded(context.Background())
	eventually(t, "the unrecorded driver ended", func() bool { return !alive(stray) })
	if !alive(kept) || second.PID("beta") != kept {
		t.Fatalf("the recorded driver %d was not adopted (beta is %d, alive %v)", kept, second.PID("beta"), alive(kept))
	}
	// The second core's own launches are never taken for strays.
	mustDriver(t, second, "alpha")
	own := second.PID("alpha")
	second.AdoptRecorded(context.Background())
	if !alive(own) {
		t.Fatal("the core ended a driver it launched itself")
	}
}
