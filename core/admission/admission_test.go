// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func ready(d *Deployment, gen uint64) {
	d.Sync(gen, []Target{{Instance: "d/0", Generation: gen}})
}

func TestDeployment_EnterBounds(t *testing.T) {
	cases := []struct {
		name       string
		cfg        Config
		places     int
		maxWaiting int
		bytes      int64
		requests   int
		wantPlaces int
		wantWait   int
		wantFull   int
	}{
		{"places then line then full", Config{}, 2, 3, 10, 7, 2, 3, 2},
		{"nobody may wait", Config{}, 1, 0, 10, 3, 1, 0, 2},
		{"total bound", Config{MaxWaitingTotal: 2}, 1, 64, 10, 5, 1, 2, 2},
		{"bytes bound", Config{MaxWaitingBytes: 25}, 1, 64, 10, 5, 1, 2, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := New(c.cfg).Deployment("d")
			d.SetLimits(c.places, c.maxWaiting)
			ready(d, 1)
			var placed, waiting, full int
			for i := 0; i < c.requests; i++ {
				p, w, err := d.Enter(c.bytes)
				switch {
				case err != nil:
					e := structs.AsError(err)
					if e.Code != structs.CodeQueueFull || e.RetryAfter != 1 {
						t.Fatalf("refusal %v", err)
					}
					full++
				case p != nil:
					placed++
				case w != nil:
					waiting++
				}
			}
			if placed != c.wantPlaces || waiting != c.wantWait || full != c.wantFull {
				t.Fatalf("placed %d waiting %d full %d, want %d %d %d", placed, waiting, full, c.wantPlaces, c.wantWait, c.wantFull)
			}
		})
	}
}

func TestDeployment_FIFOAndLeave(t *testing.T) {
	c := New(Config{})
	d := c.Deployment("d")
	d.SetLimits(1, 8)
	ready(d, 1)
	p, _, _ := d.Enter(1)
	_, w1, _ := d.Enter(1)
	_, w2, _ := d.Enter(1)
	_, w3, _ := d.Enter(1)
	if w2.Position() != 1 {
		t.Fatalf("position %d", w2.Position())
	}
	w2.Leave()
	p.Done()
	<-w1.C()
	select {
	case <-w3.C():
		t.Fatal("w3 granted before w1 finished")
	default:
	}
	w1.Place().Done()
	<-w3.C()
	w3.Leave() // granted, then left: the place is freed
	if n, b := c.WaitingAll(); n != 0 || b != 0 {
		t.Fatalf("waiting %d bytes %d", n, b)
	}
	if cnt := d.Counts(); cnt.Live != 0 || cnt.Waiting != 0 {
		t.Fatalf("counts %+v", cnt)
	}
}

func TestDeployment_Settlement(t *testing.T) {
	now := time.Unix(1000, 0)
	d := New(Config{Now: func() time.Time { return now }}).Deployment("d")
	d.SetLimits(4, 8)
	ready(d, 1)
	enter := func() *Place {
		p, _, err := d.Enter(1)
		if err != nil || p == nil {
			t.Fatalf("enter: %v", err)
		}
		return p
	}
	idle := enter().Cut(SettleWhenIdle)
	stop := enter().Cut(SettleAtStop)
	abort := enter().Cut(SettleOnAbort)
	enter().Failed()
	c := d.Counts()
	if c.SettleWhenIdle != 2 || c.SettleAtStop != 1 || c.SettleOnAbort != 1 || c.Live != 0 {
		t.Fatalf("counts %+v", c)
	}
	// A reading that began before the cut proves nothing.
	if n := d.SettleIdle("d/0", now.Add(-time.Second)); n != 0 {
		t.Fatalf("settled %d on an older reading", n)
	}
	if n := d.SettleIdle("d/0", now.Add(time.Second)); n != 2 {
		t.Fatalf("settled %d on the idle reading, want 2", n)
	}
	if idle.Settle(); d.Counts().SettleAtStop != 1 {
		t.Fatal("the idle reading settled a request cut before the engine answered")
	}
	abort.Downgrade(SettleAtStop)
	if c := d.Counts(); c.SettleAtStop != 2 || c.SettleOnAbort != 0 {
		t.Fatalf("after the failed abort %+v", c)
	}
	d.Stopped("d/0", 1)
	if c := d.Counts(); c.SettleAtStop != 0 {
		t.Fatalf("after the stop %+v", c)
	}
	stop.Settle() // settling twice is harmless
	// A restart (new generation in the route table) settles what is left.
	enter().Cut(SettleAtStop)
	ready(d, 2)
	if c := d.Counts(); c.SettleAtStop != 0 {
		t.Fatalf("after the restart %+v", c)
	}
}

func TestDeployment_NoIdleSignal(t *testing.T) {
	d := New(Config{}).Deployment("d")
	d.SetLimits(4, 8)
	ready(d, 1)
	p1, _, _ := d.Enter(1)
	p2, _, _ := d.Enter(1)
	p1.Cut(SettleWhenIdle)
	p2.Failed()
	d.NoIdleSignal("d/0")
	if c := d.Counts(); c.SettleAtStop != 1 || c.SettleWhenIdle != 0 {
		t.Fatalf("counts %+v: a cut waits for the next stop, an error answer settles", c)
	}
}

func TestDeployment_SaturationRestarts(t *testing.T) {
	got := make(chan string, 4)
	d := New(Config{OnSaturated: func(dep, inst string) { got <- dep + " " + inst }}).Deployment("d")
	d.SetLimits(2, 8)
	ready(d, 1)
	for i := 0; i < 2; i++ {
		p, _, _ := d.Enter(1)
		p.Cut(SettleAtStop)
	}
	select {
	case s := <-got:
		t.Fatalf("restart %q with nobody waiting", s)
	default:
	}
	_, w, err := d.Enter(1)
	if err != nil || w == nil {
		t.Fatalf("the request must wait, not be refused: %v", err)
	}
	if s := <-got; s != "d d/0" {
		t.Fatalf("restart of %q", s)
	}
	ready(d, 2) // the restarted instance
	<-w.C()
	w.Place().Done()
	if len(got) != 0 {
		t.Fatal("restarted twice")
	}
}
