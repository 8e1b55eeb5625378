// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/structs"
)

// turnClient does for the switch tests what the router does for a request:
// it enters the model's line in the real admission controller, activates
// the model when it has no ready instance, follows the route table, and
// records the order in which requests got their places.
type turnClient struct {
	t   *testing.T
	f   *fixture
	adm *admission.Controller
	ctx context.Context
	wg  sync.WaitGroup

	mu     sync.Mutex
	order  []string
	places map[string]*admission.Place
	served chan string
}

// newTurnFixture is a fixture on the real admission controller: a card of
// 10 units where a ready model takes 6 and a parked one 1 (one model
// serves at a time).
func newTurnFixture(t *testing.T, mutate ...func(*Config)) (*fixture, *turnClient) {
	adm := admission.New(admission.Config{})
	t.Cleanup(adm.Close)
	f := newFixture(t, 10, 6, 1, append([]func(*Config){func(c *Config) {
		c.Requests = adm
		// The admission controller's clock is the real one: so is the
		// turns'.
		c.Now = time.Now
	}}, mutate...)...)
	ctx, cancel := context.WithCancel(context.Background())
	c := &turnClient{t: t, f: f, adm: adm, ctx: ctx, places: map[string]*admission.Place{}, served: make(chan string, 64)}
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	return f, c
}

// sync brings a deployment's admission state up to date with the route
// table, as the router does before it admits.
func (c *turnClient) sync(dep string) *admission.Deployment {
	d := c.adm.Deployment(dep)
	d.SetLimits(1, 64)
	r := c.f.m.Routes().Lookup(dep)
	var ts []admission.Target
	for _, t := range r.Ready {
		ts = append(ts, admission.Target{Instance: t.Instance, Generation: t.Generation})
	}
	d.Sync(r, ts)
	return d
}

// send sends request name for dep. It returns once the request holds a
// place or waits in the model's line, so the test decides the order of
// arrivals; its place arrives later (c.served).
func (c *turnClient) send(dep, name string) {
	c.t.Helper()
	d := c.sync(dep)
	p, w, err := d.Enter(1)
	if err != nil {
		c.t.Fatalf("%s: %v", name, err)
	}
	if p != nil {
		c.got(name, p)
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			changed := c.f.m.Board().Changed()
			if !c.sync(dep).Ready() {
				c.wg.Add(1)
				go func() {
					defer c.wg.Done()
					if err := c.f.m.Activate(c.ctx, dep); err != nil && c.ctx.Err() == nil {
						c.t.Logf("activate %s: %v", dep, err)
					}
				}()
			}
			select {
			case <-w.C():
				c.got(name, w.Place())
				return
			case <-changed:
			case <-c.ctx.Done():
				w.Leave()
				return
			}
		}
	}()
}

func (c *turnClient) got(name string, p *admission.Place) {
	c.mu.Lock()
	c.order = append(c.order, name)
	c.places[name] = p
	c.mu.Unlock()
	c.served <- name
}

// next waits for the next request to get its place.
func (c *turnClient) next() string {
	c.t.Helper()
	select {
	case n := <-c.served:
		return n
	case <-time.After(10 * time.Second):
		c.t.Fatalf("no request got a place; served so far %v", c.orderNow())
		return ""
	}
}

// done ends a request that holds a place.
func (c *turnClient) done(name string) {
	c.mu.Lock()
	p := c.places[name]
	c.mu.Unlock()
	p.Done()
}

func (c *turnClient) orderNow() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.order...)
}

// turnGate is a deployment's admission turn ("open", "ending", "ended").
func (c *turnClient) turnGate(dep string) string { return c.adm.Deployment(dep).Turn().Gate }

// TestSwitch_BatchesServeAAABC: with A in memory and serving, requests
// that wait in the order A B A A C are served A A A (A's batch), then B,
// then C: one switch to B and one to C, none back and forth.
func TestSwitch_BatchesServeAAABC(t *testing.T) {
	f, c := newTurnFixture(t)
	for _, n := range []string{"a", "b", "c"} {
		f.deploy(n)
	}
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	c.send("a", "A0") // holds A's only place
	if c.next() != "A0" {
		t.Fatal("A0 was not served at once")
	}
	c.send("a", "A1")
	c.send("b", "B1")
	f.eventually("b to contend a's memory (a's turn ending)", func() bool { return c.turnGate("a") == "ending" })
	c.send("a", "A2")
	c.send("a", "A3")
	c.send("c", "C1")
	f.eventually("c to wait for its turn", func() bool { return f.m.switches.has("c") })
	last := "A0"
	for i := 0; i < 5; i++ {
		c.done(last)
		last = c.next()
	}
	c.done(last)
	want := []string{"A0", "A1", "A2", "A3", "B1", "C1"}
	if got := c.orderNow(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	if s := f.drv.starts.Load() + f.drv.wakes.Load(); s != 3 {
		t.Fatalf("%d starts and wakes, want 3 (a, then b, then c)", s)
	}
	st := f.m.SwitchStats()
	f.eventually("the switch to c to complete", func() bool { return f.m.SwitchStats().Switches == 2 })
	if st.Turns["a"] != 1 || st.TurnReasons[admission.TurnEndedIdle] == 0 {
		t.Fatalf("switch stats %+v: a's turn should have ended once, a idle", st)
	}
}

// TestSwitch_NoStarvation: a stream of requests for A, each new one sent
// as the last is served, never keeps B waiting past the turn bound: with a
// budget of two requests, B is served after at most two more of A's, and
// the A requests that arrived after A's turn ended wait for A's next turn.
// The second case bounds the turn by time only.
func TestSwitch_NoStarvation(t *testing.T) {
	cases := []struct {
		name      string
		requests  int
		turnTime  time.Duration
		maxBefore int // A requests served between B's arrival and B
	}{
		{"a budget of requests", 2, time.Hour, 2},
		{"a budget of time", 0, 50 * time.Millisecond, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newTurnFixture(t, func(cfg *Config) {
				cfg.Switching.TurnRequests = tc.requests
				cfg.Switching.TurnTime = tc.turnTime
			})
			f.deploy("a")
			f.deploy("b")
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			c.send("a", "A0")
			c.next()
			c.send("a", "A1")
			c.send("b", "B")
			f.eventually("b to contend a's memory", func() bool { return c.turnGate("a") != "open" })
			// The stream: every time one of A's requests is served, the
			// next arrives, so A's line is never empty.
			last, n, before := "A0", 2, 0
			giveUp := time.Now().Add(10 * time.Second) // a failure's bound, not a timing
			for {
				c.send("a", fmt.Sprintf("A%d", n))
				n++
				c.done(last)
				last = c.next()
				if last == "B" {
					break
				}
				before++
				if time.Now().After(giveUp) {
					t.Fatalf("B starved: %d of A's requests served before it", before)
				}
			}
			if tc.maxBefore >= 0 && before > tc.maxBefore {
				t.Fatalf("%d of A's requests served after B arrived, want at most %d", before, tc.maxBefore)
			}
			// A's requests that waited are served in A's next turn.
			c.done("B")
			for i := 0; i < n-1-before; i++ {
				c.done(c.next())
			}
			if s := f.state("a"); s != structs.StateReady {
				t.Fatalf("a is %s after its next turn", s)
			}
		})
	}
}

// TestWaitEstimate_FromMeasuredFigures: a request for a parked model that
// needs a busy model's memory is told the wait the measured figures give:
// the busy model's remaining requests at its mean service time, its
// measured park, and the parked model's measured wake from its tier.
func TestWaitEstimate_FromMeasuredFigures(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	f.deploy("b")
	for _, n := range []string{"b", "a"} { // b parks for a
		if err := f.activate(n); err != nil {
			t.Fatal(err)
		}
	}
	if s := f.state("b"); s != structs.StateParked {
		t.Fatalf("b is %s", s)
	}
	set := func(name string, tm structs.Timings) {
		in, err := f.m.instance(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		in.update(func(r *structs.InstanceRecord) {
			r.Timings = &tm
			if r.State == structs.StateParked {
				r.ParkTier = structs.ResidencyHostBacked // parked at level 1
			}
		})
	}
	set("a", structs.Timings{ParkMs: 500, StartMs: 20000})
	set("b", structs.Timings{WakeMs: map[string]int64{structs.ResidencyDeep: 3000, structs.ResidencyHostBacked: 800}, StartMs: 20000})
	f.reqs.mu.Lock()
	f.reqs.active["a/0"] = 2
	f.reqs.service["a"] = time.Second
	f.reqs.mu.Unlock()

	est, ok := f.m.WaitEstimate("b")
	if !ok || !est.Switch {
		t.Fatalf("estimate %+v %v: b needs a's memory", est, ok)
	}
	// a serves 2 more requests, one place at a time, 1 s each; parks in
	// 0.5 s; b wakes from host RAM, where it parked, in 0.8 s.
	if want := 3300 * time.Millisecond; est.Wait != want || est.Floor != want {
		t.Fatalf("expected wait %v (measured %v), want %v", est.Wait, est.Floor, want)
	}
	if fmt.Sprint(est.Holding) != "[a]" || est.Ahead != 0 {
		t.Fatalf("holding %v ahead %d", est.Holding, est.Ahead)
	}
	if _, ok := f.m.WaitEstimate("a"); ok {
		t.Fatal("a ready model got an estimate")
	}
}

// TestWaitEstimate_CountsTheLeastTurn: a model in the way that came in
// lately keeps its turn, idle or not, for its least turn (4 × its measured
// wake of 1 s and park of 0.5 s: 6 s), so a request for a parked model is
// told that wait, not only the park and its wake: 2 s after a came in, b
// waits a's 4 s left, a's park (0.5 s) and its own wake (0.8 s). A model
// whose turn comes first keeps its whole least turn once in.
func TestWaitEstimate_CountsTheLeastTurn(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	for _, n := range []string{"a", "b", "c"} {
		f.deploy(n)
	}
	for _, n := range []string{"c", "b", "a"} { // each parks for the next
		if err := f.activate(n); err != nil {
			t.Fatal(err)
		}
	}
	set := func(name string, tm structs.Timings) {
		in, err := f.m.instance(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		in.update(func(r *structs.InstanceRecord) {
			r.Timings = &tm
			if r.State == structs.StateParked {
				r.ParkTier = structs.ResidencyHostBacked
			}
		})
	}
	wake := map[string]int64{structs.ResidencyDeep: 1000, structs.ResidencyHostBacked: 1000}
	set("a", structs.Timings{WakeMs: wake, ParkMs: 500, StartMs: 20000})
	set("b", structs.Timings{WakeMs: map[string]int64{structs.ResidencyHostBacked: 800}, ParkMs: 500, StartMs: 20000})
	set("c", structs.Timings{WakeMs: wake, ParkMs: 500, StartMs: 20000})
	f.clock.Advance(2 * time.Second)

	est, ok := f.m.WaitEstimate("b")
	if !ok || !est.Switch {
		t.Fatalf("estimate %+v %v: b needs a's memory", est, ok)
	}
	if want := 5300 * time.Millisecond; est.Wait != want || est.Floor != want {
		t.Fatalf("expected wait %v (measured %v), want %v: a's least turn left (4s), its park and b's wake", est.Wait, est.Floor, want)
	}
	// c's turn comes first: once in, it keeps its least turn (6 s).
	now := f.clock.Now()
	tk := f.m.switches.join("c", now.Add(-time.Minute), now)
	defer f.m.switches.leave(tk)
	est, _ = f.m.WaitEstimate("b")
	if want := (5300 + 500 + 1000 + 6000) * time.Millisecond; est.Floor != want || est.Ahead != 1 {
		t.Fatalf("expected wait %v (measured %v, %d ahead), want %v measured with c ahead: a's least turn left, a's park, c's wake and least turn, the park, b's wake",
			est.Wait, est.Floor, est.Ahead, want)
	}
}

// TestSwitchQueue_OldestRequestFirst: contenders take their turns in the
// order of their longest-waiting requests, not the order they joined.
func TestSwitchQueue_OldestRequestFirst(t *testing.T) {
	var q switchQueue
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := q.join("b", t0.Add(2*time.Second), t0.Add(3*time.Second))
	c := q.join("c", t0.Add(time.Second), t0.Add(4*time.Second)) // joined later, waited longer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.await(ctx, c, nil); err != nil {
		t.Fatalf("c is not the head: %v", err)
	}
	if got := q.order(); len(got) != 2 || got[0].dep != "c" || got[1].dep != "b" {
		t.Fatalf("order %v, want c then b", got)
	}
	q.leave(c)
	if err := q.await(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	q.leave(b)
}

// TestSwitchQueue_Yield: a head that cannot make room because what is in
// the way waits for its own turn gives the head to the next contender and
// takes it back, first, once that one is done.
func TestSwitchQueue_Yield(t *testing.T) {
	var q switchQueue
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := q.join("b", t0, t0)
	c := q.join("c", t0.Add(time.Second), t0.Add(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.await(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	q.yield(b)
	if err := q.await(ctx, c, nil); err != nil {
		t.Fatalf("c did not get the head b yielded: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- q.await(ctx, b, nil) }()
	q.leave(c)
	if err := <-got; err != nil {
		t.Fatalf("b did not get the head back: %v", err)
	}
	q.leave(b)
}

// turnRecorder is a scripted Requests that records the turns it was told
// to close.
type turnRecorder struct {
	*fakeRequests
	mu      sync.Mutex
	closed  []string
	lingers []string // "dep linger" of each Contend
}

func (r *turnRecorder) Contend(dep string, _ int, linger time.Duration) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lingers = append(r.lingers, fmt.Sprintf("%s %s", dep, linger))
	return closedChan
}

func (r *turnRecorder) contended() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lingers...)
}

func (r *turnRecorder) CloseTurn(dep string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = append(r.closed, dep)
}

func (r *turnRecorder) closedTurns() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.closed...)
}

// TestAwaitTurn_TheSwitchCountsInTheTurn: a busy model's turn ends early
// enough that the waiting model's switch fits in the turn time: b's
// longest-waiting request has waited 25 s of a 30 s turn, and what the
// switch still takes once a's turn ended is measured at 6 s (a's running
// request draining at its mean service time of 1 s, a's park of 2 s, b's
// start of 3 s), so a's turn ends now, not in 5 s with b served 6 s after
// that. The switch counts at most half the turn: a turn keeps at least
// half of it, however slow the switch.
func TestAwaitTurn_TheSwitchCountsInTheTurn(t *testing.T) {
	rec := &turnRecorder{fakeRequests: newFakeRequests()}
	f := newFixture(t, 10, 6, 1, func(c *Config) {
		c.Requests = rec
		c.Switching.TurnTime = 30 * time.Second
	})
	f.deploy("a")
	f.deploy("b")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	a, _ := f.m.instance("a", 0)
	b, _ := f.m.instance("b", 0)
	a.update(func(r *structs.InstanceRecord) { r.Timings = &structs.Timings{ParkMs: 2000, StartMs: 9000} })
	b.update(func(r *structs.InstanceRecord) { r.Timings = &structs.Timings{StartMs: 3000} })
	rec.fakeRequests.mu.Lock()
	rec.fakeRequests.service["a"] = time.Second
	rec.fakeRequests.mu.Unlock()
	v := &victim{in: a, rec: a.snapshot(), dep: "a", parks: true, active: 1}
	after := f.m.switchAfterTurn(v, b)
	if after != 6*time.Second {
		t.Fatalf("the switch after a's turn is measured at %s, want 6s", after)
	}
	// The turn's end is decided before any wait: with the context already
	// ended, a turn that is not over is left open.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ended := make(chan struct{})
	close(ended)
	_ = f.m.awaitTurn(ctx, ended, "a", f.clock.Now().Add(-25*time.Second), after)
	if got := rec.closedTurns(); fmt.Sprint(got) != "[a]" {
		t.Fatalf("turns closed %v, want a's: b's request has waited the turn time less its switch", got)
	}
	_ = f.m.awaitTurn(ctx, ended, "a", f.clock.Now().Add(-23*time.Second), after)
	if got := rec.closedTurns(); len(got) != 1 {
		t.Fatalf("turns closed %v: a's turn ended with a second of it left", got)
	}
	b.update(func(r *structs.InstanceRecord) { r.Timings = &structs.Timings{StartMs: 40000} })
	if got := f.m.switchAfterTurn(v, b); got != 15*time.Second {
		t.Fatalf("with b's start at 40s the switch counts %s, want 15s (half the turn)", got)
	}
}

// TestSwitch_LeastTurnFromTheMeasuredSwitch: a model that came in lately
// keeps its turn, idle or not, for leastTurnFactor times what its switch
// was measured to cost (4 × its wake of 1 s and park of 0.5 s: 6 s), so that
// switching takes a bounded share of the card's time; past that an idle
// model lingers only its measured bring-back (1 s), and the least turn
// never exceeds the turn time.
func TestSwitch_LeastTurnFromTheMeasuredSwitch(t *testing.T) {
	rec := &turnRecorder{fakeRequests: newFakeRequests()}
	f := newFixture(t, 10, 6, 1, func(c *Config) {
		c.Requests = rec
		c.Switching.TurnTime = 30 * time.Second
	})
	f.deploy("a")
	f.deploy("b")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	a, _ := f.m.instance("a", 0)
	a.update(func(r *structs.InstanceRecord) {
		r.Timings = &structs.Timings{WakeMs: map[string]int64{structs.ResidencyDeep: 1000, structs.ResidencyHostBacked: 1000}, ParkMs: 500, StartMs: 9000}
	})
	v := &victim{in: a, rec: a.snapshot(), dep: "a", parks: true, measured: time.Second}
	if got := f.m.leastTurnLeft(v); got != 6*time.Second {
		t.Fatalf("least turn left %s just after a came in, want 6s", got)
	}
	f.clock.Advance(2 * time.Second)
	if got := f.m.leastTurnLeft(v); got != 4*time.Second {
		t.Fatalf("least turn left %s 2s after a came in, want 4s", got)
	}
	// The switch for b asks a to end its turn lingering what is left.
	if err := f.activate("b"); err != nil {
		t.Fatal(err)
	}
	if got := rec.contended(); fmt.Sprint(got) != "[a 4s]" {
		t.Fatalf("a contended %v, want [a 4s] (what is left of its least turn, more than its 1s wake)", got)
	}
	f.clock.Advance(time.Minute)
	if got := f.m.leastTurnLeft(v); got != 0 {
		t.Fatalf("least turn left %s a minute later, want 0", got)
	}
	a.update(func(r *structs.InstanceRecord) { r.Timings.ParkMs = 9000 })
	v.rec.Since = f.clock.Now()
	if got := f.m.leastTurnLeft(v); got != 30*time.Second {
		t.Fatalf("least turn left %s with a 10s switch, want the turn time (30s)", got)
	}
}
