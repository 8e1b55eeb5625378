// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"time"
)

// A deployment's turn. When models compete for one card, the lifecycle's
// switch asks the model in the way to end its turn (Contend): the model
// goes on serving what comes for it, the requests in its line and those
// that arrive (one batch), while it has anything to do and its budget
// lasts; once nothing waits for it and nothing runs, or the budget is
// spent, it closes: no place is granted any more, new requests wait in its
// line for its next turn, and what it still serves drains. The switch then
// parks or stops it and brings the other model in. The gate opens again
// when the model is ready again (Reopen), or when the switch gives up on
// it.
//
// IMPORTANT: the gate is decided here, under the deployment's lock, by the
// code that grants places (Enter and dispatch). The switch never reads a
// count and closes the gate later: it asks, and waits for the channel that
// says the turn ended.

// turnGate is where a deployment's turn is.
type turnGate int

const (
	// gateOpen grants places as usual.
	gateOpen turnGate = iota
	// gateContended grants places from the line while it is not empty and
	// the turn's budget lasts.
	gateContended
	// gateClosed grants nothing: the turn ended.
	gateClosed
)

// String names the gate as status shows it.
func (g turnGate) String() string {
	switch g {
	case gateContended:
		return "ending"
	case gateClosed:
		return "ended"
	}
	return "open"
}

// Turn reasons: why a contended turn ended.
const (
	// TurnEndedIdle: nothing waited for the model and nothing ran.
	TurnEndedIdle = "idle"
	// TurnEndedRequests: the turn's budget of requests was spent.
	TurnEndedRequests = "budget_requests"
	// TurnEndedTime: the turn's time ran out (CloseTurn).
	TurnEndedTime = "budget_time"
)

// turn is a deployment's turn state; d.mu guards it.
type turn struct {
	gate turnGate
	// left is the grants the contended turn may still make (-1: no bound).
	left int
	// served counts the grants since the turn was contended.
	served int
	// ended is closed when the gate closes; nil while open.
	ended chan struct{}
	// why says why it closed.
	why string
	// linger is how long an idle contended model waits for a new request
	// before its turn ends; idleSince when it went idle (zero while busy),
	// timer the pending end.
	linger    time.Duration
	idleSince time.Time
	timer     *time.Timer
}

// Contend asks a deployment to end its turn because another model waits
// for its memory. It keeps granting places, to its line and to new
// arrivals, while it has requests waiting or running, at most requests
// more (0: no bound); once idle it ends after linger without a new
// request (0: at once). The returned channel is closed when the turn
// ended.
//
// The linger is the switch's choice: the time it would take to bring the
// model back. Evicting a model whose next request comes sooner than that
// costs more than waiting for it (the ski rental's rule), and requests
// that come in gaps shorter than that are one batch.
func (d *Deployment) Contend(requests int, linger time.Duration) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := &d.turn
	if t.gate == gateOpen {
		t.gate = gateContended
		t.ended = make(chan struct{})
		t.served = 0
		t.left = -1
		if requests > 0 {
			t.left = requests
		}
		t.linger = max(linger, 0)
	}
	d.turnCheck()
	return t.ended
}

// CloseTurn ends a contended turn now: its time ran out.
func (d *Deployment) CloseTurn() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.turn.gate == gateContended {
		d.closeTurn(TurnEndedTime)
	}
}

// Reopen opens the gate: the model is ready again after its turn, or the
// switch that contended it gave up.
func (d *Deployment) Reopen() {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := &d.turn
	if t.gate == gateOpen {
		return
	}
	if t.gate == gateContended {
		close(t.ended)
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	*t = turn{}
	d.dispatch()
}

// TurnState is a deployment's turn as status shows it.
type TurnState struct {
	// Gate is "open", "ending" (contended: serving its line) or "ended".
	Gate string `json:"gate"`
	// Served is the places granted since the turn was contended.
	Served int `json:"served,omitempty"`
	// Why says why the turn ended.
	Why string `json:"why,omitempty"`
}

// Turn returns the deployment's turn.
func (d *Deployment) Turn() TurnState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return TurnState{Gate: d.turn.gate.String(), Served: d.turn.served, Why: d.turn.why}
}

// granting reports whether the gate lets a place be granted; d.mu is held.
func (d *Deployment) granting() bool { return d.turn.gate != gateClosed }

// granted counts a grant against a contended turn; d.mu is held.
func (d *Deployment) granted() {
	t := &d.turn
	if t.gate != gateContended {
		return
	}
	t.served++
	if t.left > 0 {
		t.left--
	}
}

// turnCheck closes a contended turn whose model is idle (nothing waits,
// nothing runs) or whose budget is spent; d.mu is held.
func (d *Deployment) turnCheck() {
	t := &d.turn
	if t.gate != gateContended {
		return
	}
	if t.left == 0 {
		d.closeTurn(TurnEndedRequests)
		return
	}
	if len(d.queue) > 0 || d.live() > 0 {
		t.idleSince = time.Time{} // busy: the linger starts over when idle
		return
	}
	now := d.c.cfg.Now()
	if t.idleSince.IsZero() {
		t.idleSince = now
	}
	left := t.linger - now.Sub(t.idleSince)
	if left <= 0 {
		d.closeTurn(TurnEndedIdle)
		return
	}
	if t.timer == nil {
		t.timer = time.AfterFunc(left, d.lingerEnded)
	} else {
		t.timer.Reset(left)
	}
}

// lingerEnded looks again once an idle model's linger may be over.
func (d *Deployment) lingerEnded() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.turnCheck()
}

// closeTurn closes the gate; d.mu is held.
func (d *Deployment) closeTurn(why string) {
	t := &d.turn
	t.gate = gateClosed
	t.why = why
	if t.timer != nil {
		t.timer.Stop()
	}
	close(t.ended)
}

// live is the requests being served on every instance; d.mu is held.
func (d *Deployment) live() int {
	n := 0
	for _, in := range d.instances {
		n += in.live
	}
	return n
}

// OldestWaiting is when the request that has waited longest in the line
// arrived; ok is false when nobody waits.
func (d *Deployment) OldestWaiting() (at time.Time, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.queue) == 0 {
		return time.Time{}, false
	}
	// The line is in fair order between keys, not in arrival order.
	at = d.queue[0].at
	for _, w := range d.queue[1:] {
		if w.at.Before(at) {
			at = w.at
		}
	}
	return at, true
}

// serviceAlpha weighs the newest hold in the moving average of how long a
// request holds a place.
const serviceAlpha = 0.2

// observeHold folds one request's hold of a place into the deployment's
// moving average; d.mu is held.
func (d *Deployment) observeHold(hold time.Duration) {
	if hold <= 0 {
		return
	}
	if d.service == 0 {
		d.service = hold
		return
	}
	d.service = time.Duration(serviceAlpha*float64(hold) + (1-serviceAlpha)*float64(d.service))
}

// arrived folds an arrival into the moving average of the gaps between
// arrivals; d.mu is held.
func (d *Deployment) arrived(now time.Time) {
	if !d.lastArrival.IsZero() {
		g := max(now.Sub(d.lastArrival), 0)
		if d.gap == 0 {
			d.gap = g
		} else {
			d.gap = time.Duration(serviceAlpha*float64(g) + (1-serviceAlpha)*float64(d.gap))
		}
	}
	d.lastArrival = now
}

// ArrivalRate is the deployment's recent arrivals per second (0 before
// two arrivals): the moving average of the gaps between arrivals, counting
// the gap since the last one, so that a model nobody asks for any more
// fades.
func (d *Deployment) ArrivalRate() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gap <= 0 {
		return 0
	}
	gap := d.gap
	if since := d.c.cfg.Now().Sub(d.lastArrival); since > gap {
		gap = time.Duration(serviceAlpha*float64(since) + (1-serviceAlpha)*float64(gap))
	}
	return float64(time.Second) / float64(max(gap, time.Millisecond))
}

// ServiceTime is the moving average of how long a request held a place
// (0 until one was measured): what a switch's estimate of a turn uses.
func (d *Deployment) ServiceTime() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.service
}
