// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

const gib = int64(1) << 30

// discrete is a host with 64 GiB of RAM (32 managed, 12.8 reserved) and
// one 24 GiB card (1.92 reserved, 22.08 managed).
func discrete(t *testing.T) *Ledger {
	t.Helper()
	l, err := New([]Domain{
		{Name: DomainSystem, Kind: KindSystem, Capacity: 64 * gib, ManagedLimit: 32 * gib, FreeReserve: 64 * gib / 5},
		{Name: "gpu0", Kind: KindDevice, Capacity: 24 * gib, ManagedLimit: 24*gib - 24*gib*8/100, FreeReserve: 24 * gib * 8 / 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func plan(l *Ledger, startup, ready, parked map[string]int64) Plan {
	must := func(m map[string]int64) Charges {
		if m == nil {
			return nil
		}
		c, err := l.Charges(m)
		if err != nil {
			panic(err)
		}
		return c
	}
	return Plan{Startup: must(startup), Ready: must(ready), Parked: must(parked)}
}

func TestDomain_Room(t *testing.T) {
	cases := []struct {
		name string
		d    Domain
		want int64
	}{
		{name: "managed limit binds", d: Domain{Capacity: 100, ManagedLimit: 50, FreeReserve: 20}, want: 50},
		{name: "reserve binds", d: Domain{Capacity: 100, ManagedLimit: 90, FreeReserve: 20}, want: 80},
		{name: "external inside the reserve is not counted twice", d: Domain{Capacity: 100, ManagedLimit: 80, FreeReserve: 20, External: 15}, want: 80},
		{name: "external beyond the reserve narrows the room", d: Domain{Capacity: 100, ManagedLimit: 80, FreeReserve: 20, External: 35}, want: 65},
		{name: "external over everything", d: Domain{Capacity: 100, ManagedLimit: 80, FreeReserve: 20, External: 150}, want: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.d.Room(); got != c.want {
				t.Fatalf("Room() = %d, want %d", got, c.want)
			}
		})
	}
}

func TestDomain_Validate(t *testing.T) {
	ok := Domain{Name: "system", Kind: KindSystem, Capacity: 100, ManagedLimit: 50, FreeReserve: 20}
	cases := []struct {
		name     string
		mut      func(d *Domain)
		contains string
	}{
		{name: "valid", mut: func(*Domain) {}},
		{name: "no name", mut: func(d *Domain) { d.Name = "" }, contains: "no name"},
		{name: "unknown kind", mut: func(d *Domain) { d.Kind = "swap" }, contains: "unknown kind"},
		{name: "no capacity", mut: func(d *Domain) { d.Capacity = 0 }, contains: "capacity"},
		{name: "zero limit", mut: func(d *Domain) { d.ManagedLimit = 0 }, contains: "not positive"},
		{name: "limit above capacity", mut: func(d *Domain) { d.ManagedLimit = 101 }, contains: "above the capacity"},
		{name: "reserve eats everything", mut: func(d *Domain) { d.FreeReserve = 100 }, contains: "leaves nothing"},
		{name: "limit and reserve do not fit together", mut: func(d *Domain) { d.ManagedLimit = 90 }, contains: "add up to more than the capacity"},
		{name: "negative reserve", mut: func(d *Domain) { d.FreeReserve = -1 }, contains: "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := ok
			c.mut(&d)
			err := d.Validate()
			if c.contains == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.contains) {
				t.Fatalf("Validate() = %v, want it to contain %q", err, c.contains)
			}
		})
	}
}

func TestNew_Refusals(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Fatal("New(nil) accepted no domains")
	}
	d := Domain{Name: "gpu0", Kind: KindDevice, Capacity: 10, ManagedLimit: 8, FreeReserve: 2}
	if _, err := New([]Domain{d, d}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("duplicate domain: %v", err)
	}
	if _, err := New([]Domain{{Name: "gpu0", Kind: KindDevice, Capacity: 10, ManagedLimit: 11}}); err == nil {
		t.Fatal("a limit above the capacity was accepted")
	}
}

func TestLedger_Place(t *testing.T) {
	type step struct {
		owner  string
		device int64
		host   int64
		fits   bool
		// blocked names the domains refused, in order.
		blocked []string
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{name: "two fit together", steps: []step{
			{owner: "a/0", device: 10 * gib, host: 4 * gib, fits: true},
			{owner: "b/0", device: 10 * gib, host: 4 * gib, fits: true},
		}},
		{name: "the third does not fit on the card", steps: []step{
			{owner: "a/0", device: 10 * gib, host: 4 * gib, fits: true},
			{owner: "b/0", device: 10 * gib, host: 4 * gib, fits: true},
			{owner: "c/0", device: 8 * gib, host: 4 * gib, blocked: []string{"gpu0"}},
		}},
		{name: "host and card both short", steps: []step{
			{owner: "a/0", device: 20 * gib, host: 30 * gib, fits: true},
			{owner: "b/0", device: 4 * gib, host: 4 * gib, blocked: []string{DomainSystem, "gpu0"}},
		}},
		{name: "exactly the limit fits", steps: []step{
			{owner: "a/0", device: 24*gib - 24*gib*8/100, host: 32 * gib, fits: true},
		}},
		{name: "a re-place replaces the owner's own charge", steps: []step{
			{owner: "a/0", device: 20 * gib, fits: true},
			{owner: "a/0", device: 22 * gib, fits: true},
		}},
		{name: "overflow blocks", steps: []step{
			{owner: "a/0", device: 1 * gib, fits: true},
			{owner: "b/0", device: math.MaxInt64, blocked: []string{"gpu0"}},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := discrete(t)
			for _, s := range c.steps {
				ch := map[string]int64{"gpu0": s.device, DomainSystem: s.host}
				p := plan(l, ch, ch, nil)
				before := l.Snapshot()
				f, err := l.Place(s.owner, p, PhaseStartup)
				if s.fits {
					if err != nil || !f.Fits {
						t.Fatalf("place %s: %v", s.owner, err)
					}
					continue
				}
				var be *BlockedError
				if !errors.As(err, &be) {
					t.Fatalf("place %s: err = %v, want a BlockedError", s.owner, err)
				}
				var got []string
				for _, sh := range be.Shortfalls {
					got = append(got, sh.Domain)
				}
				if !reflect.DeepEqual(got, s.blocked) {
					t.Fatalf("blocked = %v, want %v", got, s.blocked)
				}
				if after := l.Snapshot(); !reflect.DeepEqual(before, after) {
					t.Fatalf("a refused place changed the ledger")
				}
			}
		})
	}
}

func TestLedger_ShortfallFigures(t *testing.T) {
	l := discrete(t)
	p := plan(l, map[string]int64{"gpu0": 10 * gib}, map[string]int64{"gpu0": 10 * gib}, nil)
	for _, o := range []string{"a/0", "b/0"} {
		if _, err := l.Place(o, p, PhaseStartup); err != nil {
			t.Fatal(err)
		}
	}
	p8 := plan(l, map[string]int64{"gpu0": 8 * gib}, map[string]int64{"gpu0": 8 * gib}, nil)
	_, err := l.Place("c/0", p8, PhaseStartup)
	var be *BlockedError
	if !errors.As(err, &be) || len(be.Shortfalls) != 1 {
		t.Fatalf("err = %v", err)
	}
	s := be.Shortfalls[0]
	limit := 24*gib - 24*gib*8/100
	want := Shortfall{Domain: "gpu0", Kind: KindDevice, Need: 8 * gib, Free: limit - 20*gib, Limit: limit, Room: limit,
		Capacity: 24 * gib, Reserve: 24 * gib * 8 / 100, Charged: 20 * gib, Short: 8*gib - (limit - 20*gib)}
	if s != want {
		t.Fatalf("shortfall = %+v\nwant       %+v", s, want)
	}
	if msg := be.Error(); !strings.Contains(msg, "gpu0: needs 8GiB, 2.1GiB free of a 22.1GiB managed limit (20GiB charged), 5.9GiB short") {
		t.Fatalf("message = %q", msg)
	}
}

func TestLedger_SetPhase(t *testing.T) {
	l := discrete(t)
	p := plan(l,
		map[string]int64{"gpu0": 20 * gib, DomainSystem: 4 * gib},
		map[string]int64{"gpu0": 12 * gib, DomainSystem: 4 * gib},
		map[string]int64{"gpu0": 1 * gib, DomainSystem: 4 * gib})
	if _, err := l.Place("a/0", p, PhaseStartup); err != nil {
		t.Fatal(err)
	}
	// Another owner fills what the startup peak gives back.
	if _, err := l.SetPhase("a/0", PhaseReady); err != nil {
		t.Fatal(err)
	}
	q := plan(l, map[string]int64{"gpu0": 9 * gib}, map[string]int64{"gpu0": 9 * gib}, nil)
	if _, err := l.Place("b/0", q, PhaseStartup); err != nil {
		t.Fatalf("b after a is ready: %v", err)
	}
	// a parks: always admitted.
	if _, err := l.SetPhase("a/0", PhaseParked); err != nil {
		t.Fatal(err)
	}
	// c takes the room a freed; a's wake no longer fits.
	r := plan(l, map[string]int64{"gpu0": 11 * gib}, map[string]int64{"gpu0": 11 * gib}, nil)
	if _, err := l.Place("c/0", r, PhaseStartup); err != nil {
		t.Fatal(err)
	}
	before := l.Snapshot()
	if _, err := l.SetPhase("a/0", PhaseReady); err == nil {
		t.Fatal("a wake over the limit was admitted")
	}
	if !reflect.DeepEqual(before, l.Snapshot()) {
		t.Fatal("a refused wake changed the ledger")
	}
	if _, err := l.SetPhase("a/0", PhaseStopped); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.Owner("a/0"); len(st.Charges) != 0 {
		t.Fatalf("stopped owner still charged: %v", st.Charges)
	}
	if _, err := l.SetPhase("nobody", PhaseReady); !errors.Is(err, ErrUnknownOwner) {
		t.Fatalf("unknown owner: %v", err)
	}
	if _, err := l.SetPhase("b/0", "cold"); !errors.Is(err, ErrUnknownPhase) {
		t.Fatalf("unknown phase: %v", err)
	}
	if !l.Release("b/0") || l.Release("b/0") {
		t.Fatal("release should report the owner once")
	}
	if got := l.Charged(1); got != 11*gib {
		t.Fatalf("gpu0 charged %d, want c's 11 GiB", got)
	}
}

func TestLedger_External(t *testing.T) {
	l := discrete(t)
	limit := 24*gib - 24*gib*8/100
	p := plan(l, map[string]int64{"gpu0": limit}, map[string]int64{"gpu0": limit}, nil)
	// 1 GiB held by a display server lies inside the 1.92 GiB reserve.
	if err := l.SetExternal("gpu0", gib); err != nil {
		t.Fatal(err)
	}
	if f, _ := l.ForecastPlace("a/0", p, PhaseStartup); !f.Fits {
		t.Fatalf("memory held outside CapyCTL was counted twice: %+v", f.Blocked)
	}
	// 3 GiB goes beyond the reserve by 1.08 GiB.
	if err := l.SetExternal("gpu0", 3*gib); err != nil {
		t.Fatal(err)
	}
	f, _ := l.ForecastPlace("a/0", p, PhaseStartup)
	if f.Fits || f.Blocked[0].Short != 3*gib-24*gib*8/100 {
		t.Fatalf("forecast = %+v", f)
	}
	if err := l.SetExternal("gpu9", 1); !errors.Is(err, ErrUnknownDomain) {
		t.Fatalf("unknown domain: %v", err)
	}
}

func TestLedger_Charges(t *testing.T) {
	l := discrete(t)
	if _, err := l.Charges(map[string]int64{"gpu7": 1}); !errors.Is(err, ErrUnknownDomain) {
		t.Fatalf("unknown domain: %v", err)
	}
	if _, err := l.Charges(map[string]int64{"gpu0": -1}); !errors.Is(err, ErrBadCharge) {
		t.Fatalf("negative: %v", err)
	}
	if _, err := l.Place("a/0", Plan{Startup: Charges{1}}, PhaseStartup); !errors.Is(err, ErrBadCharge) {
		t.Fatalf("short vector: %v", err)
	}
	c, err := l.Charges(map[string]int64{"gpu0": 5, "gpu7": 0})
	if err != nil || !reflect.DeepEqual(l.ByName(c), map[string]int64{"gpu0": 5}) {
		t.Fatalf("round trip: %v %v", c, err)
	}
}

func TestLedger_RestoreOverLimit(t *testing.T) {
	l := discrete(t)
	big := plan(l, map[string]int64{"gpu0": 30 * gib}, map[string]int64{"gpu0": 30 * gib}, nil)
	if err := l.Restore("a/0", big, PhaseReady); err != nil {
		t.Fatal(err)
	}
	s := l.Snapshot()
	if s.Domains[1].Charged != 30*gib || s.Domains[1].Free != 0 {
		t.Fatalf("restored charge: %+v", s.Domains[1])
	}
	small := plan(l, map[string]int64{"gpu0": 1}, map[string]int64{"gpu0": 1}, nil)
	if _, err := l.Place("b/0", small, PhaseStartup); err == nil {
		t.Fatal("a place beside an over-limit restore was admitted")
	}
	// Lowering is always admitted.
	if _, err := l.SetPhase("a/0", PhaseStopped); err != nil {
		t.Fatal(err)
	}
}
