// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// withShortfalls makes the fixture's placer say what is short and read
// its charges, as the ledger does: a switch then knows whether one victim
// alone frees enough, and waits for a model on its way before it evicts
// one for only part of the room.
func withShortfalls(c *Config) {
	p := c.Placer.(*unitPlacer)
	p.shortfalls = true
	c.Placer = unitCharges{p}
}

// switchHead reports whether a contender is making room.
func (f *fixture) switchHead() bool {
	f.m.switches.mu.Lock()
	defer f.m.switches.mu.Unlock()
	return f.m.switches.head != nil
}

// roomCard is a card of 12 units with a and p ready (6 each; parked 1):
// neither alone frees the 6 a third model needs (each parks to 1), so a
// switch waits for a model on its way before it evicts one of them. p is
// held starting (the stub's probe gate) until the test closes the gate.
func roomCard(t *testing.T, mutate ...func(*Config)) *fixture {
	t.Helper()
	f := newFixture(t, 12, 6, 1, append([]func(*Config){withShortfalls}, mutate...)...)
	for _, n := range []string{"a", "p", "b", "c"} {
		f.deploy(n)
	}
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	f.drv.probeGate = make(chan struct{})
	if err := f.m.StartDeployment(context.Background(), "p", StartOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("p to be starting", func() bool { return f.state("p") == structs.StateStarting })
	return f
}

// TestSwitch_TheHeadDoesNotWaitForAContenderInLine is the long soak's stall
// (seed 5859785809691648487: an operator's start --wait never answered).
// b's activation makes room and waits for p, on its way; c's activation
// joins the line behind it. Once p is ready, b must evict: c's lane is
// busy (waiting in line) but holds nothing. The head used to count every
// busy lane of a stopped instance as "a start between its reservation and
// its record" and wait for it, while c waited for the head: both waited for
// ever, and so did every later start or stop of b and c (their lanes held).
func TestSwitch_TheHeadDoesNotWaitForAContenderInLine(t *testing.T) {
	f := roomCard(t)
	errs := map[string]chan error{"b": make(chan error, 1), "c": make(chan error, 1)}
	go func() { errs["b"] <- f.activate("b") }()
	f.eventually("b to make room (waiting for p)", f.switchHead)
	go func() { errs["c"] <- f.activate("c") }()
	f.eventually("c to wait in line", func() bool { return f.m.switches.has("c") })
	close(f.drv.probeGate)
	for _, n := range []string{"b", "c"} {
		if err := <-errs[n]; err != nil {
			t.Fatalf("activate %s: %v (want ready: idle a and p can make room)", n, err)
		}
	}
	// Both brought in, one after the other; nothing is left charged but
	// what the instances hold.
	if s := f.state("c"); s != structs.StateReady {
		t.Fatalf("c is %s, want ready", s)
	}
	if f.placer.maxSeen > 12 {
		t.Fatalf("the card was charged %d units of 12", f.placer.maxSeen)
	}
}

// shortDeadline gives b a request deadline of 300 ms: its activation waits
// for room at most that long.
func shortDeadline(t *testing.T, f *fixture) {
	t.Helper()
	spec := f.spec("b")
	spec.RequestDeadline = structs.Duration(300 * time.Millisecond)
	if _, _, err := f.m.Deploy(context.Background(), &spec, DeployOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestSwitch_RoomWaitIsBoundedByARequestDeadline: an activation that waits
// for room that never comes (p never ready: its probe hangs) ends with a
// coded answer once a request's deadline has passed (the deployment's
// request_deadline here), and its lane is free again: an operator's start
// then gets its own answer instead of waiting behind it for ever.
func TestSwitch_RoomWaitIsBoundedByARequestDeadline(t *testing.T) {
	f := roomCard(t)
	shortDeadline(t, f)
	// The caller's bound is a failure's bound only: the activation must
	// answer well before it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := f.m.activateOnce(ctx, "b")
	if ctx.Err() != nil || !structs.HasCode(err, structs.CodeActivationTimeout) {
		t.Fatalf("activate b: %v, want activation_timeout from the lifecycle (it waited for room past a request's deadline)", err)
	}
	if e := structs.AsError(err); e.RetryAfter == 0 {
		t.Fatalf("activation_timeout without Retry-After: %+v", e)
	}
	err = f.m.StartDeployment(ctx, "b", StartOptions{Wait: true})
	if ctx.Err() != nil || !structs.HasCode(err, structs.CodeCapacityBlocked) {
		t.Fatalf("operator's start of b: %v, want capacity_blocked (its lane free again)", err)
	}
	close(f.drv.probeGate)
}

// TestActivate_ACallerStillWaitingAsksAgain: the activation's bound frees
// the lane (an operator's start queued behind it gets its answer), but a
// caller that still waits — a request with time left of its own deadline —
// is not answered activation_timeout for a wait that began before it: it
// asks again, and is served once room comes.
func TestActivate_ACallerStillWaitingAsksAgain(t *testing.T) {
	f := roomCard(t)
	shortDeadline(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.m.Activate(ctx, "b") }()
	f.eventually("b to make room (waiting for p)", f.switchHead)
	// Queued behind b's activation: answered once it gave up on its room.
	if err := f.m.StartDeployment(ctx, "b", StartOptions{Wait: true}); ctx.Err() != nil || !structs.HasCode(err, structs.CodeCapacityBlocked) {
		t.Fatalf("operator's start of b: %v, want capacity_blocked once the activation freed the lane", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the caller was answered %v while it still waited: it should have asked again", err)
	default:
	}
	close(f.drv.probeGate) // room comes: p is ready, a and p can be parked
	if err := <-done; err != nil {
		t.Fatalf("activate b: %v, want ready", err)
	}
	if s := f.state("b"); s != structs.StateReady {
		t.Fatalf("b is %s, want ready", s)
	}
}
