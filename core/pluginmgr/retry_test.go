// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"syscall"
	"testing"
	"time"

	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
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
		_, err := d.Flags(ctx, &pb.FlagsRequest{})
		cancel()
		if err != nil {
			t.Fatalf("round %d: a call right after the driver died: %v", round+1, err)
		}
		if p := m.PID("alpha"); p == pid || p <= 0 {
			t.Fatalf("round %d: the call was answered by driver %d, the dead one was %d", round+1, p, pid)
		}
	}
}
