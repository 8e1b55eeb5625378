// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"testing"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// TestPark_LevelByHostRoom: a model whose driver picks the tier at each
// park (vLLM's sleep levels) parks host_backed (level 1: the weights kept
// in host RAM, the ledger charging them there) when host RAM has room, and
// deep (level 2: the weights dropped) when it has not; it wakes from the
// tier it parked at, and the event and the record say which. A residency
// of deep declared by the operator, and a driver that parks at its launch's
// residency only, park deep whatever the room.
func TestPark_LevelByHostRoom(t *testing.T) {
	cases := []struct {
		name        string
		hostRoom    int // host RAM units; the copy of the weights takes 4
		declared    string
		tierPerPark bool
		unified     bool
		want        string
		wantPhase   string
	}{
		{"room for the weights: level 1", 10, "", true, false, structs.ResidencyHostBacked, ledger.PhaseParkedHost},
		{"no room for the weights: level 2", 3, "", true, false, structs.ResidencyDeep, ledger.PhaseParked},
		{"host_backed without room falls back to level 2", 3, structs.ResidencyHostBacked, true, false, structs.ResidencyDeep, ledger.PhaseParked},
		{"deep declared: level 2 whatever the room", 10, structs.ResidencyDeep, true, false, structs.ResidencyDeep, ledger.PhaseParked},
		{"a unified pool: level 2", 10, "", true, true, structs.ResidencyDeep, ledger.PhaseParked},
		{"a driver that parks at its launch's residency", 10, "", false, false, structs.ResidencyDeep, ledger.PhaseParked},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1, func(cfg *Config) {
				cfg.Host.Policy = &sdk.HostPolicy{Unified: c.unified}
			})
			f.drv.tiers = []string{structs.ResidencyDeep, structs.ResidencyHostBacked}
			f.drv.tierPerPark = c.tierPerPark
			f.placer.hostCapacity, f.placer.hostCopy = c.hostRoom, 4
			f.deploy("a", func(d *structs.Deployment) { d.Residency = c.declared })
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			if err := f.m.ParkDeployment(context.Background(), "a", true); err != nil {
				t.Fatal(err)
			}
			rec := f.inst("a")
			if rec.State != structs.StateParked || rec.ParkTier != c.want || rec.Phase != c.wantPhase {
				t.Fatalf("parked %s at %q, phase %q; want %q, %q", rec.State, rec.ParkTier, rec.Phase, c.want, c.wantPhase)
			}
			if ph := f.placer.phase("a/0"); ph != c.wantPhase {
				t.Fatalf("the ledger charges %q, want %q", ph, c.wantPhase)
			}
			f.drv.mu.Lock()
			asked := fmt.Sprint(f.drv.parkedAt)
			f.drv.mu.Unlock()
			if asked != fmt.Sprint([]string{c.want}) {
				t.Fatalf("the driver was asked to park at %s, want [%s]", asked, c.want)
			}
			if ev := lastEvent(t, f, "instance_parked"); ev.Payload["tier"] != c.want {
				t.Fatalf("the parked event says tier %v, want %s", ev.Payload["tier"], c.want)
			}
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			f.drv.mu.Lock()
			woke := fmt.Sprint(f.drv.wokeFrom)
			f.drv.mu.Unlock()
			if woke != fmt.Sprint([]string{c.want}) {
				t.Fatalf("woken from %s, want [%s]", woke, c.want)
			}
			if rec := f.inst("a"); rec.ParkTier != "" || rec.State != structs.StateReady {
				t.Fatalf("after the wake: %s, tier %q", rec.State, rec.ParkTier)
			}
		})
	}
}

// lastEvent returns the last journaled event of a kind.
func lastEvent(t *testing.T, f *fixture, kind string) structs.Event {
	t.Helper()
	evs, err := f.st.EventsAfter(0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == kind {
			return evs[i]
		}
	}
	t.Fatalf("no %s event", kind)
	return structs.Event{}
}
