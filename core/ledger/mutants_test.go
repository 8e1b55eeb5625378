// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"math"
	"strings"
	"testing"
)

// Tests written against the mutants make mutate found alive in this
// package (website/content/operations/mutation-testing.md).

// TestLedger_KeepingAChargeOverTheRoom: an owner restored over the room
// may move to a phase with the same charge; only a rise is checked.
func TestLedger_KeepingAChargeOverTheRoom(t *testing.T) {
	l := discrete(t)
	same := map[string]int64{"gpu0": 30 * gib}
	if err := l.Restore("a/0", plan(l, same, same, nil), PhaseStartup); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetPhase("a/0", PhaseReady); err != nil {
		t.Fatalf("the same charge in the next phase was refused: %v", err)
	}
}

func TestLedger_HasAndOwner(t *testing.T) {
	l := discrete(t)
	if l.Has("a/0") {
		t.Fatal("an empty ledger has a/0")
	}
	if _, ok := l.Owner("a/0"); ok {
		t.Fatal("an empty ledger shows a/0")
	}
	p := plan(l, map[string]int64{"gpu0": gib}, map[string]int64{"gpu0": 2 * gib}, nil)
	if _, err := l.Place("a/0", p, PhaseStartup); err != nil {
		t.Fatal(err)
	}
	o, ok := l.Owner("a/0")
	if !l.Has("a/0") || !ok || o.Phase != PhaseStartup || o.Charges["gpu0"] != gib || o.Plan[PhaseReady]["gpu0"] != 2*gib {
		t.Fatalf("owner %+v %v", o, ok)
	}
	l.Release("a/0")
	if l.Has("a/0") {
		t.Fatal("a released owner is still held")
	}
}

func TestAddChecked(t *testing.T) {
	cases := []struct {
		a, b int64
		sum  int64
		ok   bool
	}{
		{1, 2, 3, true},
		{math.MaxInt64 - 1, 1, math.MaxInt64, true},
		{math.MaxInt64, 1, 0, false},
		{math.MaxInt64, 0, math.MaxInt64, true},
		{math.MinInt64 + 1, -1, math.MinInt64, true},
		{math.MinInt64, -1, 0, false},
		{-5, -3, -8, true},
	}
	for _, c := range cases {
		if sum, ok := addChecked(c.a, c.b); sum != c.sum || ok != c.ok {
			t.Errorf("addChecked(%d, %d) = %d, %v; want %d, %v", c.a, c.b, sum, ok, c.sum, c.ok)
		}
	}
}

// TestShortfall_External: the memory held outside CapyCTL is named only
// when it is more than the reserve (which is set aside anyway).
func TestShortfall_External(t *testing.T) {
	s := Shortfall{Domain: "gpu0", Need: 2 * gib, Free: gib, Limit: 8 * gib, Reserve: gib, External: gib, Short: gib}
	if msg := s.String(); strings.Contains(msg, "outside") {
		t.Fatalf("%q names external memory no larger than the reserve", msg)
	}
	s.External = 2 * gib
	if msg := s.String(); !strings.Contains(msg, "2GiB held outside CapyCTL") {
		t.Fatalf("%q does not name the external memory", msg)
	}
}

// TestLedger_EpochOnEveryChange: every change moves the epoch forward (a
// reader compares epochs to see that the ledger changed).
func TestLedger_EpochOnEveryChange(t *testing.T) {
	l := discrete(t)
	last := l.Snapshot().Epoch
	step := func(what string) {
		t.Helper()
		if e := l.Snapshot().Epoch; e <= last {
			t.Fatalf("%s: epoch %d after %d", what, e, last)
		}
		last = l.Snapshot().Epoch
	}
	p := plan(l, map[string]int64{"gpu0": gib}, map[string]int64{"gpu0": gib}, nil)
	if _, err := l.Place("a/0", p, PhaseStartup); err != nil {
		t.Fatal(err)
	}
	step("place")
	if err := l.SetExternal("gpu0", gib); err != nil {
		t.Fatal(err)
	}
	step("external memory")
	l.Release("a/0")
	step("release")
}

// TestSize_WholeLimitAtItsEdges: a startup estimate above the device limit
// for a model that fits once ready sets aside the whole limit; an estimate
// at the limit exactly, or a limit that is unknown, does not.
func TestSize_WholeLimitAtItsEdges(t *testing.T) {
	const limit = 20 * gib
	cases := []struct {
		name        string
		hints       Hints
		deviceLimit int64
		startup     int64
		prov        string
	}{
		{"ready at the limit, startup above it", Hints{ReadyDeviceBytes: limit, ReadyHostBytes: gib, StartupDeviceBytes: limit + gib}, limit, limit, ProvWholeHost},
		{"startup at the limit exactly", Hints{ReadyDeviceBytes: limit - gib, ReadyHostBytes: gib, StartupDeviceBytes: limit}, limit, limit, ProvPlaceholder},
		{"no device limit known", Hints{ReadyHostBytes: gib, StartupDeviceBytes: 2 * gib}, 0, 2 * gib, ProvPlaceholder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Size(SizingInput{Residency: "restart_only", Hints: c.hints, DeviceLimit: c.deviceLimit, HostLimit: 32 * gib})
			if err != nil {
				t.Fatal(err)
			}
			if s.Startup.Device != c.startup || s.StartupDeviceProvenance != c.prov {
				t.Fatalf("startup %d (%s), want %d (%s)", s.Startup.Device, s.StartupDeviceProvenance, c.startup, c.prov)
			}
		})
	}
}

// TestSize_KVCacheDefaults: with weights and no device limit known, the KV
// cache is the default maximum; with a declared request and no weights
// known, no KV cache is derived.
func TestSize_KVCacheDefaults(t *testing.T) {
	s, err := Size(SizingInput{Residency: "restart_only", Hints: Hints{WeightsBytes: 8 * gib}})
	if err != nil || s.KVCache != MaxDefaultKV {
		t.Fatalf("no device limit: KV %d, %v; want %d", s.KVCache, err, MaxDefaultKV)
	}
	in := SizingInput{Residency: "restart_only", DeviceLimit: 20 * gib}
	in.Memory.Request = 8 * gib
	s, err = Size(in)
	if err != nil || s.KVCache != 0 {
		t.Fatalf("a declared request without weights: KV %d, %v; want none derived", s.KVCache, err)
	}
}

// TestSize_Edges: the refusal of a request that leaves exactly no KV cache,
// the startup of a unified machine whose request dominates, and
// measurements that saw nothing on the card.
func TestSize_Edges(t *testing.T) {
	in := SizingInput{Residency: "restart_only", Hints: Hints{WeightsBytes: 10 * gib}, DeviceLimit: 40 * gib}
	in.Memory.Request = 11 * gib // 110% of the weights: nothing left for a KV cache
	if _, err := Size(in); err == nil {
		t.Fatal("a request leaving no KV cache was accepted")
	}

	in = SizingInput{Residency: "restart_only", Unified: true, Hints: Hints{WeightsBytes: gib}, DeviceLimit: 100 * gib}
	in.Memory.KVCache = 30 * gib
	s, err := Size(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := s.Ready.Device + GraphsAllowance; s.Startup.Device != want {
		t.Fatalf("unified startup %d, want the request and the graphs %d", s.Startup.Device, want)
	}

	in = SizingInput{Residency: "restart_only", Hints: Hints{WeightsBytes: 8 * gib}, DeviceLimit: 40 * gib,
		Measured: &Measured{HostBytes: 300 << 20}}
	if s, err := Size(in); err != nil || s.StartupDeviceProvenance != ProvPlaceholder || s.StartupHostProvenance != ProvMeasured {
		t.Fatalf("a host-only measurement: %+v %v", s, err)
	}

	in = SizingInput{Residency: "deep", Hints: Hints{WeightsBytes: 8 * gib}, DeviceLimit: 40 * gib,
		MeasuredParked: &Measured{HostBytes: 300 << 20}}
	if s, err := Size(in); err != nil || s.ParkedProvenance != ProvPlaceholder {
		t.Fatalf("a parked measurement with nothing on the card: %+v %v", s, err)
	}
}

// TestSize_HostLimitEdges: the host side of the whole-limit rule touches
// only a placeholder above the host limit for a model that fits once
// ready; a measured startup, a ready charge at the limit exactly or above
// it stay as they are.
func TestSize_HostLimitEdges(t *testing.T) {
	const limit = 32 * gib
	cases := []struct {
		name     string
		hints    Hints
		measured *Measured
		host     int64
		prov     string
	}{
		{"measured above the limit", Hints{WeightsBytes: 8 * gib}, &Measured{HostBytes: limit + gib}, limit + gib, ProvMeasured},
		{"ready at the limit", Hints{ReadyDeviceBytes: 4 * gib, ReadyHostBytes: limit}, nil, limit, ProvPlaceholder},
		{"ready above the limit", Hints{ReadyDeviceBytes: 4 * gib, ReadyHostBytes: limit + gib}, nil, limit + gib, ProvPlaceholder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Size(SizingInput{Residency: "restart_only", Hints: c.hints, Measured: c.measured, DeviceLimit: 40 * gib, HostLimit: limit})
			if err != nil {
				t.Fatal(err)
			}
			if s.Startup.Host != c.host || s.StartupHostProvenance != c.prov {
				t.Fatalf("startup host %d (%s), want %d (%s)", s.Startup.Host, s.StartupHostProvenance, c.host, c.prov)
			}
		})
	}
}
