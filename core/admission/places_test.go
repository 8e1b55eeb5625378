// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"testing"
	"time"
)

// Tests written against the mutants make mutate found alive in this
// package (website/content/operations/mutation-testing.md): which instance
// a request gets, what frees a waiter, and the defaults of the bounds.

func two(d *Deployment) {
	d.Sync(1, []Target{{Instance: "d/0", Generation: 1}, {Instance: "d/1", Generation: 1}})
}

// liveOf is each instance's requests in flight, by instance ID.
func liveOf(d *Deployment) map[string]int {
	out := map[string]int{}
	for _, ic := range d.Counts().Instances {
		out[ic.ID] = ic.Live
	}
	return out
}

func mustPlace(t *testing.T, d *Deployment) *Place {
	t.Helper()
	p, w, err := d.Enter(1)
	if err != nil || p == nil {
		t.Fatalf("enter: place %v, waiter %v, %v", p, w, err)
	}
	return p
}

// granted reports whether the waiter has its place now.
func granted(w *Waiter) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

func TestDeployment_PicksTheLeastHeldInstance(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(4, 8)
	two(d)
	var held []*Place
	for i := 0; i < 6; i++ {
		held = append(held, mustPlace(t, d))
	}
	if got := liveOf(d); got["d/0"] != 3 || got["d/1"] != 3 {
		t.Fatalf("in flight %v, want 3 and 3", got)
	}
	// The one freed is the one refilled.
	held[0].Done()
	before := liveOf(d)
	mustPlace(t, d)
	after := liveOf(d)
	if after["d/0"] != 3 || after["d/1"] != 3 || before["d/0"]+before["d/1"] != 5 {
		t.Fatalf("in flight %v then %v: the freed instance was not the one refilled", before, after)
	}
}

func TestDeployment_RotatesAmongEquals(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(4, 8)
	two(d)
	used := map[string]int{}
	for i := 0; i < 4; i++ {
		p := mustPlace(t, d)
		used[p.in.id]++
		p.Done()
	}
	if used["d/0"] != 2 || used["d/1"] != 2 {
		t.Fatalf("one request at a time went to %v, want each instance in turn", used)
	}
}

func TestDeployment_DefaultPlaces(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(0, 0)
	ready(d, 1)
	for i := 0; i < DefaultPlaces; i++ {
		mustPlace(t, d)
	}
	if c := d.Counts(); c.Places != DefaultPlaces || c.Live != DefaultPlaces {
		t.Fatalf("counts %+v, want %d places in use", c, DefaultPlaces)
	}
}

// TestDeployment_WhatFreesAWaiter: one place, held; the request behind it
// waits, and gets the place as soon as the holder's place is freed,
// whatever frees it.
func TestDeployment_WhatFreesAWaiter(t *testing.T) {
	now := time.Unix(1000, 0)
	cases := []struct {
		name string
		hold func(p *Place)
		free func(d *Deployment)
	}{
		{"more places", func(*Place) {}, func(d *Deployment) { d.SetLimits(2, 8) }},
		{"an idle reading", func(p *Place) { p.Cut(SettleWhenIdle) }, func(d *Deployment) { d.SettleIdle("d/0", now.Add(time.Second)) }},
		{"no idle signal for an error answer", func(p *Place) { p.Failed() }, func(d *Deployment) { d.NoIdleSignal("d/0") }},
		{"the engine's stop", func(p *Place) { p.Cut(SettleAtStop) }, func(d *Deployment) { d.Stopped("d/0", 1) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := New(Config{Now: func() time.Time { return now }}).Deployment("d")
			d.SetLimits(1, 8)
			ready(d, 1)
			c.hold(mustPlace(t, d))
			_, w, err := d.Enter(1)
			if err != nil || w == nil {
				t.Fatalf("the second request must wait: %v", err)
			}
			if granted(w) {
				t.Fatal("granted while the place is held")
			}
			c.free(d)
			if !granted(w) {
				t.Fatalf("still waiting after the place was freed: %+v", d.Counts())
			}
		})
	}
}

// TestDeployment_GoneInstanceKeepsWhatItHolds: an instance that leaves the
// route table while a cut request holds its place keeps it counted until
// its stop settles it; an instance that leaves holding nothing is
// forgotten.
func TestDeployment_GoneInstanceKeepsWhatItHolds(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(4, 8)
	two(d)
	p := mustPlace(t, d) // on d/0: the first in turn
	p.Cut(SettleAtStop)
	d.Sync(2, nil)
	c := d.Counts()
	if c.SettleAtStop != 1 || len(c.Instances) != 1 || c.Instances[0].ID != p.in.id {
		t.Fatalf("counts %+v, want only %s, still holding its cut request", c, p.in.id)
	}
	d.Stopped(p.in.id, 1)
	if c := d.Counts(); c.SettleAtStop != 0 {
		t.Fatalf("counts %+v after the stop", c)
	}
}

// TestDeployment_NoRestartWithNobodyWaiting: cut requests that now wait
// for the next stop fill every place, but nobody waits: no restart.
func TestDeployment_NoRestartWithNobodyWaiting(t *testing.T) {
	got := make(chan string, 1)
	d := New(Config{OnSaturated: func(dep, inst string) { got <- inst }}).Deployment("d")
	d.SetLimits(2, 8)
	ready(d, 1)
	mustPlace(t, d).Cut(SettleWhenIdle)
	mustPlace(t, d).Cut(SettleWhenIdle)
	d.NoIdleSignal("d/0")
	if c := d.Counts(); c.SettleAtStop != 2 {
		t.Fatalf("counts %+v", c)
	}
	d.c.Close()
	select {
	case inst := <-got:
		t.Fatalf("%s restarted with nobody waiting", inst)
	default:
	}
}

// TestDeployment_WaitingBytesBoundIsInclusive: bodies up to the bound
// exactly may wait.
func TestDeployment_WaitingBytesBoundIsInclusive(t *testing.T) {
	d := New(Config{MaxWaitingBytes: 20}).Deployment("d")
	d.SetLimits(1, 8)
	ready(d, 1)
	mustPlace(t, d)
	for i := 0; i < 2; i++ {
		if _, w, err := d.Enter(10); err != nil || w == nil {
			t.Fatalf("waiter %d of 10 bytes under a 20-byte bound: %v", i, err)
		}
	}
	if _, _, err := d.Enter(1); err == nil {
		t.Fatal("a byte over the bound was let wait")
	}
}

// TestDeployment_TransitDefault: a reading that began within the transit
// margin of a cut (DefaultTransit when unset) proves nothing; one after it
// does. A negative margin is none.
func TestDeployment_TransitDefault(t *testing.T) {
	cases := []struct {
		name    string
		transit time.Duration
		margin  time.Duration // the reading's start after the cut that must not settle
	}{
		{"default", 0, DefaultTransit / 2},
		{"set", 2 * DefaultTransit, DefaultTransit * 3 / 2},
		{"none", -1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			d := New(Config{Transit: c.transit, Now: func() time.Time { return now }}).Deployment("d")
			d.SetLimits(4, 8)
			ready(d, 1)
			mustPlace(t, d).Cut(SettleWhenIdle)
			if n := d.SettleIdle("d/0", now.Add(c.margin)); n != 0 {
				t.Fatalf("a reading %s after the cut settled it", c.margin)
			}
			want := max(c.transit, 0)
			if c.transit == 0 {
				want = DefaultTransit
			}
			if n := d.SettleIdle("d/0", now.Add(want+time.Millisecond)); n != 1 {
				t.Fatalf("a reading %s after the cut settled %d, want 1", want+time.Millisecond, n)
			}
		})
	}
}
