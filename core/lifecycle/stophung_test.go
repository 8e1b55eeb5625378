// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// TestStop_AStopInterruptedByAHungDriverIsFinished pins the fleet-trust
// review's L2: a stop whose driver hung (its Stop answered driver_timeout,
// or the driver was killed and relaunched under it) left the instance
// stopping for good, charged, and every start that needed its memory was
// refused until an operator stopped it again. Now the lifecycle finishes
// the stop itself: by retrying it (its cooldown doubling), or at once when
// the driver is relaunched.
func TestStop_AStopInterruptedByAHungDriverIsFinished(t *testing.T) {
	cases := []struct {
		name     string
		cooldown time.Duration
		// relaunch tells the lifecycle the driver was relaunched (what the
		// plugin manager's supervisor does to a driver that stops answering).
		relaunch bool
	}{
		{name: "retried", cooldown: 20 * time.Millisecond},
		{name: "finished by the relaunched driver", cooldown: time.Hour, relaunch: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1, func(cfg *Config) { cfg.StopRetryCooldown = c.cooldown })
			f.deploy("a")
			f.deploy("b")
			ctx := context.Background()
			if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); err != nil {
				t.Fatal(err)
			}
			f.drv.mu.Lock()
			f.drv.failStop = structs.Errf(structs.CodeDriverTimeout, "driver stub did not answer Stop within its deadline")
			f.drv.mu.Unlock()
			err := f.m.StopDeployment(ctx, "a", true)
			if !structs.HasCode(err, structs.CodeStillStopping) {
				t.Fatalf("stop under a hung driver: %v", err)
			}
			if s := f.state("a"); s != structs.StateStopping {
				t.Fatalf("a is %s", s)
			}
			// b does not fit beside a's charge.
			if err := f.m.StartDeployment(ctx, "b", StartOptions{Wait: true}); !structs.HasCode(err, structs.CodeCapacityBlocked) {
				t.Fatalf("start of b beside a stopping a: %v", err)
			}

			// The driver answers again.
			f.drv.mu.Lock()
			f.drv.failStop = nil
			f.drv.mu.Unlock()
			if c.relaunch {
				f.m.RecoverFamily("stub")
			}
			f.eventually("a's stop to be finished", func() bool { return f.state("a") == structs.StateStopped })
			if ph := f.placer.phase("a/0"); ph != "" {
				t.Fatalf("a stopped, still charged %q", ph)
			}
			if err := f.m.StartDeployment(ctx, "b", StartOptions{Wait: true}); err != nil {
				t.Fatalf("start of b once a stopped: %v", err)
			}
		})
	}
}
