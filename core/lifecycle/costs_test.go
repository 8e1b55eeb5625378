// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"math"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
)

// TestVictims_ByExpectedCost is the worked example of the parking page: x
// parks and wakes in 2 s, last used 10 s ago; y restarts only, starts in
// 20 s, last used 5 minutes ago. Least recently used would evict y (a 20 s
// start if it is asked for again); the expected cost evicts x:
// 2 × 60/(60+10) = 1.71 s against 20 × 60/(60+300) = 3.33 s. Under the
// immediate policy the order stays the least recently used.
func TestVictims_ByExpectedCost(t *testing.T) {
	f := newFixture(t, 100, 1, 1)
	f.deploy("x")
	f.deploy("y", func(d *structs.Deployment) { d.Residency = structs.ResidencyRestartOnly })
	f.deploy("me")
	for _, n := range []string{"x", "y", "me"} {
		if err := f.activate(n); err != nil {
			t.Fatal(err)
		}
	}
	now := f.clock.Now()
	set := func(name string, tm structs.Timings, idle time.Duration) {
		in, err := f.m.instance(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		in.update(func(r *structs.InstanceRecord) { r.Timings = &tm })
		in.lastUsed.Store(now.Add(-idle).UnixNano())
	}
	set("x", structs.Timings{WakeMs: map[string]int64{structs.ResidencyDeep: 2000}, StartMs: 20000}, 10*time.Second)
	set("y", structs.Timings{StartMs: 20000}, 5*time.Minute)
	me, _ := f.m.instance("me", 0)

	cands, pending, _ := f.m.switchCandidates(me, map[string]bool{})
	if pending || len(cands) != 2 {
		t.Fatalf("candidates %d, pending %v", len(cands), pending)
	}
	cost := map[string]float64{}
	for _, v := range cands {
		cost[v.dep] = math.Round(v.cost*100) / 100
	}
	if cost["x"] != 1.71 || cost["y"] != 3.33 {
		t.Fatalf("costs %v, want x 1.71 and y 3.33", cost)
	}
	if got := rankVictims(cands, nil)[0].dep; got != "x" {
		t.Fatalf("first victim %s, want x (the cheapest to bring back)", got)
	}
	// A victim whose eviction alone makes the room comes before a cheaper
	// one that frees only part of it.
	for _, v := range cands {
		v.frees = map[string]int64{"gpu0": map[string]int64{"x": 2, "y": 8}[v.dep]}
	}
	if got := rankVictims(cands, map[string]int64{"gpu0": 5})[0].dep; got != "y" {
		t.Fatalf("first victim %s, want y (it alone frees the 5 short)", got)
	}
	// A model asked for often is costly to evict, however recently used:
	// y at one request a second expects 30 during a 30 s turn of another,
	// each waiting for its next turn: its start plus half a turn.
	f.reqs.mu.Lock()
	f.reqs.rate["y"] = 1
	f.reqs.mu.Unlock()
	cands, _, _ = f.m.switchCandidates(me, map[string]bool{})
	for _, v := range cands {
		cost[v.dep] = math.Round(v.cost*100) / 100
	}
	if cost["y"] != 1050 || rankVictims(cands, nil)[0].dep != "x" {
		t.Fatalf("costs %v: y asked for every second should cost 30 requests × (20 s + 15 s)", cost)
	}
	f.m.cfg.Switching.Policy = PolicyImmediate
	if v, _ := f.m.pickVictim(me, map[string]bool{}); v == nil || v.dep != "y" {
		t.Fatalf("immediate policy: first victim %v, want y (least recently used)", v)
	}
}

// TestVictims_AskedForOftenWaitsForItsNextTurn: under load the requests
// for an evicted model wait for its next turn, not only for its wake. hot
// wakes in 0.5 s and is asked for twice a second; cold wakes in 3 s and is
// asked for once in ten. Weighing the requests expected during a 30 s turn
// by the bring-back alone would evict hot (0.5 × 15 = 7.5 against
// 3 × 3 = 9), and its 15 requests would each wait for its next turn; with
// the wait for the next turn (half a turn on average) it is cold:
// 0.5 × 30 × (0.5 + 15) = 232.5 against 0.1 × 30 × (3 + 15) = 54.
func TestVictims_AskedForOftenWaitsForItsNextTurn(t *testing.T) {
	f := newFixture(t, 100, 1, 1)
	for _, n := range []string{"hot", "cold", "me"} {
		f.deploy(n)
		if err := f.activate(n); err != nil {
			t.Fatal(err)
		}
	}
	now := f.clock.Now()
	for n, wake := range map[string]int64{"hot": 500, "cold": 3000} {
		in, err := f.m.instance(n, 0)
		if err != nil {
			t.Fatal(err)
		}
		in.update(func(r *structs.InstanceRecord) {
			r.Timings = &structs.Timings{WakeMs: map[string]int64{structs.ResidencyDeep: wake}, StartMs: 20000}
		})
		in.lastUsed.Store(now.UnixNano())
	}
	f.reqs.mu.Lock()
	f.reqs.rate["hot"], f.reqs.rate["cold"] = 0.5, 0.1
	f.reqs.mu.Unlock()
	me, _ := f.m.instance("me", 0)
	cands, _, _ := f.m.switchCandidates(me, map[string]bool{})
	cost := map[string]float64{}
	for _, v := range cands {
		cost[v.dep] = math.Round(v.cost*100) / 100
	}
	if cost["hot"] != 232.5 || cost["cold"] != 54 {
		t.Fatalf("costs %v, want hot 232.5 and cold 54", cost)
	}
	if got := rankVictims(cands, nil)[0].dep; got != "cold" {
		t.Fatalf("first victim %s, want cold (hot's requests would wait for its next turn)", got)
	}
}

// TestVictims_FreesOnlyWhereShort: with the shortfall known, a candidate
// whose eviction frees nothing where the requester is short is left out.
func TestVictims_FreesOnlyWhereShort(t *testing.T) {
	a := &victim{dep: "a", in: &instance{id: "a/0"}, frees: map[string]int64{ledger.DomainSystem: 10}}
	b := &victim{dep: "b", in: &instance{id: "b/0"}, frees: map[string]int64{"gpu0": 1}}
	got := rankVictims([]*victim{a, b}, map[string]int64{"gpu0": 4})
	if len(got) != 1 || got[0].dep != "b" {
		t.Fatalf("ranked %v, want only b", got)
	}
}
