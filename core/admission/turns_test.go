// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"sync"
	"testing"
	"time"
)

// closedNow reports whether ch is closed.
func closedNow(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestDeployment_ContendIdleEndsTheTurnAtOnce(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(4, 8)
	ready(d, 1)
	ended := d.Contend(0, 0)
	if !closedNow(ended) {
		t.Fatal("the turn of an idle model did not end at once")
	}
	if got := d.Turn(); got.Gate != "ended" || got.Why != TurnEndedIdle {
		t.Fatalf("turn %+v", got)
	}
	// A free place is not granted once the turn ended: the request waits
	// for the model's next turn.
	p, w, err := d.Enter(1)
	if err != nil || p != nil || w == nil {
		t.Fatalf("after the turn ended: place %v waiter %v err %v", p, w, err)
	}
	d.Reopen()
	if !granted(w) {
		t.Fatal("reopened, the waiting request got no place")
	}
	if got := d.Turn(); got.Gate != "open" {
		t.Fatalf("turn %+v", got)
	}
}

func TestDeployment_ContendServesTheBatchThenEnds(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(2, 8)
	ready(d, 1)
	p, _, _ := d.Enter(1)
	ended := d.Contend(0, 0)
	if closedNow(ended) {
		t.Fatal("the turn ended while the model served a request")
	}
	// Requests that arrive during the ending turn join the batch: a free
	// place is granted at once, the next waits in the line.
	p2, _, _ := d.Enter(1)
	_, w3, _ := d.Enter(1)
	if p2 == nil || w3 == nil {
		t.Fatalf("during the ending turn: place %v waiter %v", p2, w3)
	}
	p.Done()
	if !granted(w3) {
		t.Fatal("the waiting request was not served in the batch")
	}
	p2.Done()
	if closedNow(ended) {
		t.Fatal("the turn ended with a request still running")
	}
	w3.Place().Done()
	if !closedNow(ended) || d.Turn().Why != TurnEndedIdle || d.Turn().Served != 2 {
		t.Fatalf("turn %+v once the model was idle", d.Turn())
	}
	p4, w4, _ := d.Enter(1)
	if p4 != nil || granted(w4) {
		t.Fatal("a request after the turn ended was granted")
	}
}

func TestDeployment_ContendBudgetOfRequests(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(1, 8)
	ready(d, 1)
	p, _, _ := d.Enter(1)
	var ws []*Waiter
	for i := 0; i < 4; i++ {
		_, w, _ := d.Enter(1)
		ws = append(ws, w)
	}
	ended := d.Contend(2, 0)
	p.Done()
	ws[0].Place().Done()
	if !granted(ws[1]) || !closedNow(ended) {
		t.Fatalf("turn %+v: two grants should spend the budget", d.Turn())
	}
	if d.Turn().Why != TurnEndedRequests {
		t.Fatalf("turn %+v", d.Turn())
	}
	ws[1].Place().Done()
	if granted(ws[2]) || granted(ws[3]) {
		t.Fatal("granted past the turn's budget")
	}
}

func TestDeployment_CloseTurnAndLeave(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(1, 8)
	ready(d, 1)
	p, _, _ := d.Enter(1)
	_, w, _ := d.Enter(1)
	ended := d.Contend(0, 0)
	d.CloseTurn()
	if !closedNow(ended) || d.Turn().Why != TurnEndedTime {
		t.Fatalf("turn %+v after CloseTurn", d.Turn())
	}
	p.Done()
	if granted(w) {
		t.Fatal("granted after the turn's time ran out")
	}
	// A contended turn whose last waiter leaves, nothing running, ends.
	d.Reopen()
	<-w.C()
	_, w2, _ := d.Enter(1)
	ended = d.Contend(0, 0)
	w.Place().Done()
	if closedNow(ended) || !granted(w2) {
		t.Fatal("the waiter was not served in the ending turn")
	}
	_, w3, _ := d.Enter(1)
	// A cut request still holds its place (it settles on the engine's idle
	// reading) but runs no more: w3 waits, and the turn goes on for it.
	w2.Place().Cut(SettleWhenIdle)
	if closedNow(ended) || granted(w3) {
		t.Fatal("with a request waiting the turn ended, or the cut request's place was given")
	}
	w3.Leave()
	if !closedNow(ended) {
		t.Fatal("the turn did not end when its last request left")
	}
}

func TestDeployment_OldestWaitingAndServiceTime(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	c := New(Config{Now: clock})
	d := c.Deployment("d")
	d.SetLimits(1, 8)
	ready(d, 1)
	if _, ok := c.OldestWaiting("d"); ok {
		t.Fatal("oldest waiting with nobody waiting")
	}
	p, _, _ := d.Enter(1)
	first := clock()
	_, w, _ := d.Enter(1)
	advance(time.Second)
	_, _, _ = d.Enter(1)
	if at, ok := c.OldestWaiting("d"); !ok || !at.Equal(first) {
		t.Fatalf("oldest waiting %v %v, want %v", at, ok, first)
	}
	advance(3 * time.Second)
	p.Done()
	if got := c.ServiceTime("d"); got != 4*time.Second {
		t.Fatalf("service time %v after one hold of 4s", got)
	}
	advance(time.Second)
	w.Place().Done()
	want := time.Duration(0.2*float64(time.Second) + 0.8*float64(4*time.Second))
	if got := c.ServiceTime("d"); got != want {
		t.Fatalf("service time %v, want %v", got, want)
	}
}

// TestDeployment_ContendLingers: an idle contended model waits its linger
// (the time bringing it back would take) for a new request before its
// turn ends: one that comes within it is served in the same turn, and the
// linger starts over once the model is idle again.
func TestDeployment_ContendLingers(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(2, 8)
	ready(d, 1)
	ended := d.Contend(0, time.Hour)
	if closedNow(ended) {
		t.Fatal("an idle model's turn ended within its linger")
	}
	p, w, _ := d.Enter(1)
	if p == nil || w != nil {
		t.Fatal("a request within the linger was not served in the turn")
	}
	p.Done()
	if closedNow(ended) || d.Turn().Served != 1 {
		t.Fatalf("turn %+v", d.Turn())
	}
	d.CloseTurn()

	d2 := New(Config{}).Deployment("d2")
	d2.SetLimits(2, 8)
	ready(d2, 1)
	ended = d2.Contend(0, 5*time.Millisecond)
	select {
	case <-ended:
	case <-time.After(10 * time.Second): // a failure's bound, not a timing
		t.Fatal("the turn did not end after the linger")
	}
	if d2.Turn().Why != TurnEndedIdle {
		t.Fatalf("turn %+v", d2.Turn())
	}
}

func TestDeployment_ArrivalRate(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	d := New(Config{Now: clock}).Deployment("d")
	d.SetLimits(64, 8)
	ready(d, 1)
	if r := d.ArrivalRate(); r != 0 {
		t.Fatalf("rate %v before any arrival", r)
	}
	for i := 0; i < 10; i++ {
		if p, _, _ := d.Enter(1); p != nil {
			p.Done()
		}
		advance(500 * time.Millisecond)
	}
	if r := d.ArrivalRate(); r != 2 {
		t.Fatalf("rate %v, want 2 per second", r)
	}
	advance(time.Minute) // nobody asks any more: the rate fades
	if r := d.ArrivalRate(); r >= 1 {
		t.Fatalf("rate %v a minute after the last arrival", r)
	}
}
