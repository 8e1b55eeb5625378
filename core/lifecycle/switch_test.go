// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestManager_PickVictimOrder checks the switch's choice of victims
// directly: ready instances before parked ones, least recently used first
// within each, and never the requester's own deployment, a warm one, one
// serving requests, or one with requests waiting for it.
func TestManager_PickVictimOrder(t *testing.T) {
	f := newFixture(t, 100, 1, 1)
	for _, name := range []string{"old", "new", "parked", "warm", "serving", "wanted", "me"} {
		f.deploy(name, func(d *structs.Deployment) { d.Lifecycle.Warm = name == "warm" })
		if err := f.activate(name); err != nil {
			t.Fatalf("activate %s: %v", name, err)
		}
	}
	if err := f.m.ParkDeployment(context.Background(), "parked", true); err != nil {
		t.Fatal(err)
	}
	used := map[string]int64{"old": 10, "new": 20, "parked": 1, "warm": 0, "serving": 0, "wanted": 0, "me": 0}
	for name, at := range used {
		in, err := f.m.instance(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		in.lastUsed.Store(at)
	}
	f.reqs.mu.Lock()
	f.reqs.active["serving/0"] = 1
	f.reqs.waiting["wanted"] = 1
	f.reqs.mu.Unlock()

	me, err := f.m.instance("me", 0)
	if err != nil {
		t.Fatal(err)
	}
	tried := map[string]bool{}
	var order []string
	next := func() *instance { v, _ := f.m.pickVictim(me, tried); return v }
	for v := next(); v != nil; v = next() {
		order = append(order, v.id)
		tried[v.id+"@"+string(v.state())] = true
		if len(order) > 10 {
			break
		}
	}
	want := []string{"old/0", "new/0", "parked/0"}
	if len(order) != len(want) {
		t.Fatalf("victims %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("victims %v, want %v", order, want)
		}
	}
}

// TestManager_PickVictimTiesByID: among victims last used at the same time
// the order is by instance ID, so a switch is reproducible.
func TestManager_PickVictimTiesByID(t *testing.T) {
	f := newFixture(t, 100, 1, 1)
	for _, name := range []string{"b", "a", "me"} {
		f.deploy(name)
		if err := f.activate(name); err != nil {
			t.Fatal(err)
		}
		in, _ := f.m.instance(name, 0)
		in.lastUsed.Store(5)
	}
	me, _ := f.m.instance("me", 0)
	if v, _ := f.m.pickVictim(me, map[string]bool{}); v == nil || v.id != "a/0" {
		t.Fatalf("first victim %v, want a/0", v)
	}
}
