// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package admission owns the running places of every model instance and the
// bounded waiting line of every deployment.
//
// Each ready instance has a number of places (32, or the deployment's
// max_concurrent_requests). A request holds one place from the moment it is
// admitted until there is evidence that the engine no longer works on it:
// at once for an answer that ended normally, later for a request that was
// cut short (a hang-up, a bound): the engine's idle reading, the engine's
// next stop or restart, or the engine's own end of an aborted request.
// Requests that find no free place wait in a line per deployment, bounded
// per deployment, in total and in bytes; beyond the bounds they are
// refused with queue_full. The line is first come first served within an
// API key and fair between keys (weighted fair queuing, fair.go): one key
// flooding a model cannot starve another key's requests.
//
// Lines are per deployment, so a request for a ready model never waits
// behind requests for a model that is being woken or switched.
//
// When models compete for one card, each deployment also has a turn
// (turns.go): the lifecycle's switch asks the model in the way to end it,
// the model serves what waits in its line as one batch, then grants nothing
// until it is ready again, so that a request for it never jumps ahead of an
// older request for another model.
//
// IMPORTANT: every decision that changes counts is taken under the
// deployment's lock, by the code that changes them; nothing reads a count
// and acts on it later (a read that gates a mutation is a bug). A mutex and
// not an owner goroutine: the hot path takes it once per request and a
// channel round trip would cost more than everything else admission does.
package admission

import (
	"slices"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Defaults.
const (
	// DefaultPlaces is the running places of an instance.
	DefaultPlaces = 32
	// DefaultMaxWaiting bounds a deployment's waiting line.
	DefaultMaxWaiting = 64
	// DefaultMaxWaitingTotal bounds the requests waiting, all deployments
	// together.
	DefaultMaxWaitingTotal = 256
	// DefaultMaxWaitingBytes bounds the bodies of waiting requests, all
	// together.
	DefaultMaxWaitingBytes = 64 << 20
)

// Settle says what evidence a cut request waits for before its place is
// free again.
type Settle int

// Settlement kinds.
const (
	// SettleNow frees the place at once: the engine never had the request,
	// or finished it.
	SettleNow Settle = iota
	// SettleWhenIdle waits for the engine's idle reading: a load reading,
	// begun at least Transit after the cut, that shows no more requests
	// than CapyCTL still serves on the engine. The engine may have had the
	// request (queued or answering it).
	SettleWhenIdle
	// SettleAtStop waits for the engine's next stop or restart: its engine
	// has no load reading, so nothing else proves the request ended.
	SettleAtStop
	// SettleOnAbort waits for the engine's end of an aborted request (abort
	// by request ID).
	SettleOnAbort
)

// String names the kind as status shows it.
func (s Settle) String() string {
	switch s {
	case SettleWhenIdle:
		return "settle_when_idle"
	case SettleAtStop:
		return "settle_at_stop"
	case SettleOnAbort:
		return "settle_on_abort"
	}
	return "settled"
}

// Config bounds the waiting lines of all deployments together.
type Config struct {
	// MaxWaitingTotal bounds waiting requests (DefaultMaxWaitingTotal when
	// 0; negative: none may wait).
	MaxWaitingTotal int
	// MaxWaitingBytes bounds the bodies of waiting requests
	// (DefaultMaxWaitingBytes when 0).
	MaxWaitingBytes int64
	// OnSaturated is called, in its own goroutine, when requests wait and
	// every place of an instance is held by cut requests that settle only
	// at the engine's next stop: the lifecycle restarts the instance, which
	// settles them. It is called once per instance generation.
	OnSaturated func(deployment, instance string)
	// Transit is how long after a cut an idle reading must begin to count
	// for it (DefaultTransit when 0): a request written to the engine just
	// before the cut may still be on its way into the engine's counts.
	Transit time.Duration
	// Now is the clock (tests inject one).
	Now func() time.Time
}

// DefaultTransit is Config.Transit's default: an engine reads a request
// off its socket and counts it within a scheduler step; the margin covers
// a loaded machine and stays far below the 2 s in which a place must be
// free again once the engine reads idle.
const DefaultTransit = 250 * time.Millisecond

// Controller holds every deployment's places and line.
type Controller struct {
	cfg Config

	mu           sync.Mutex
	waiting      int
	waitingBytes int64
	deps         map[string]*Deployment

	// callbacks counts OnSaturated calls in flight: each runs on a
	// goroutine of its own, since the decision is taken under a
	// deployment's lock. Close waits for them; once closed (under cbMu)
	// no new one starts.
	cbMu      sync.Mutex
	cbClosed  bool
	callbacks sync.WaitGroup
}

// Close waits for the OnSaturated calls in flight and starts no new one.
func (c *Controller) Close() {
	c.cbMu.Lock()
	c.cbClosed = true
	c.cbMu.Unlock()
	c.callbacks.Wait()
}

// goCallback runs fn on a goroutine Close waits for.
func (c *Controller) goCallback(fn func()) {
	c.cbMu.Lock()
	defer c.cbMu.Unlock()
	if c.cbClosed {
		return
	}
	c.callbacks.Add(1)
	go func() {
		defer c.callbacks.Done()
		fn()
	}()
}

// New returns a Controller.
func New(cfg Config) *Controller {
	if cfg.MaxWaitingTotal == 0 {
		cfg.MaxWaitingTotal = DefaultMaxWaitingTotal
	}
	if cfg.MaxWaitingTotal < 0 {
		cfg.MaxWaitingTotal = 0
	}
	if cfg.MaxWaitingBytes <= 0 {
		cfg.MaxWaitingBytes = DefaultMaxWaitingBytes
	}
	if cfg.Transit == 0 {
		cfg.Transit = DefaultTransit
	}
	if cfg.Transit < 0 {
		cfg.Transit = 0
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Controller{cfg: cfg, deps: map[string]*Deployment{}}
}

// Deployment returns the admission state of a deployment, creating it.
func (c *Controller) Deployment(name string) *Deployment {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deps[name]
	if !ok {
		d = &Deployment{c: c, name: name, places: DefaultPlaces, maxWaiting: DefaultMaxWaiting}
		c.deps[name] = d
	}
	return d
}

// Forget drops a deployment's admission state when it holds nothing (no
// request in flight, waiting, or cut and waiting for evidence) and reports
// whether it did: the router forgets deleted deployments so that a role
// keeps no state for every deployment it ever served. A later Deployment
// of the same name starts afresh.
func (c *Controller) Forget(name string) bool {
	c.mu.Lock()
	d := c.deps[name]
	c.mu.Unlock()
	if d == nil {
		return false
	}
	// IMPORTANT: d.mu before c.mu, as Enter takes them.
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.queue) > 0 {
		return false
	}
	for _, in := range d.instances {
		if in.held() > 0 {
			return false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deps[name] != d {
		return false
	}
	delete(c.deps, name)
	return true
}

// Lookup returns a deployment's admission state, nil when it has none.
func (c *Controller) Lookup(name string) *Deployment {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deps[name]
}

// Deployments returns every deployment's admission state.
func (c *Controller) Deployments() []*Deployment {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Deployment, 0, len(c.deps))
	for _, d := range c.deps {
		out = append(out, d)
	}
	return out
}

// WaitingAll returns the requests waiting and their bytes, all deployments
// together.
func (c *Controller) WaitingAll() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting, c.waitingBytes
}

// Target is a ready instance as the route table shows it.
type Target struct {
	Instance   string
	Generation uint64
}

// Deployment is one deployment's places and waiting line.
type Deployment struct {
	c    *Controller
	name string

	mu         sync.Mutex
	places     int
	maxWaiting int
	instances  []*instance
	queue      []*Waiter
	rr         int
	synced     any
	// fair orders the line between the requests' keys (fair.go).
	fair fairLine
	// turn is where the deployment's turn is (turns.go).
	turn turn
	// service is the moving average of how long a request holds a place;
	// gap the moving average of the time between two arrivals, lastArrival
	// the last one.
	service     time.Duration
	gap         time.Duration
	lastArrival time.Time
}

// instance is the places of one instance.
type instance struct {
	id    string
	gen   uint64
	ready bool
	// live requests hold a place and are being served.
	live int
	// pending are cut requests waiting for evidence.
	pending []*Pending
	// saturated is set once OnSaturated was called for this generation.
	saturated bool
}

func (in *instance) held() int { return in.live + len(in.pending) }

// Name is the deployment's name.
func (d *Deployment) Name() string { return d.name }

// SetLimits sets the places per instance and the bound of the line (0:
// nobody waits). Lower limits apply to new admissions only.
func (d *Deployment) SetLimits(places, maxWaiting int) {
	if places <= 0 {
		places = DefaultPlaces
	}
	if maxWaiting < 0 {
		maxWaiting = 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	grew := places > d.places || maxWaiting != d.maxWaiting
	d.places, d.maxWaiting = places, maxWaiting
	if grew {
		d.dispatch()
	}
}

// Sync brings the instances up to date with the ready targets of the route
// table. key identifies the table's version: a Sync with the key of the
// last one does nothing (the router calls it on every request). An instance
// whose generation changed was restarted, which settles everything its
// previous launch held.
func (d *Deployment) Sync(key any, targets []Target) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if key != nil && key == d.synced {
		return
	}
	d.synced = key
	for _, in := range d.instances {
		in.ready = false
	}
	for _, t := range targets {
		in := d.find(t.Instance)
		if in == nil {
			in = &instance{id: t.Instance, gen: t.Generation}
			d.instances = append(d.instances, in)
		}
		if in.gen != t.Generation {
			d.settleAll(in)
			in.gen = t.Generation
			in.saturated = false
		}
		in.ready = true
	}
	// Forget instances that hold nothing and are gone.
	d.instances = slices.DeleteFunc(d.instances, func(in *instance) bool { return !in.ready && in.held() == 0 })
	d.dispatch()
}

func (d *Deployment) find(id string) *instance {
	for _, in := range d.instances {
		if in.id == id {
			return in
		}
	}
	return nil
}

// Ready reports whether the deployment has a ready instance.
func (d *Deployment) Ready() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, in := range d.instances {
		if in.ready {
			return true
		}
	}
	return false
}

// pick returns the ready instance with a free place and the fewest held,
// rotating among equals; d.mu is held.
func (d *Deployment) pick() *instance {
	var best *instance
	n := len(d.instances)
	for i := 0; i < n; i++ {
		in := d.instances[(d.rr+i)%n]
		if !in.ready || in.held() >= d.places {
			continue
		}
		if best == nil || in.held() < best.held() {
			best = in
		}
	}
	if best != nil && n > 1 {
		d.rr = (d.rr + 1) % n
	}
	return best
}

// Place is a running place held by one request.
type Place struct {
	d    *Deployment
	in   *instance
	done bool
	at   time.Time
	// Instance and Generation name the instance the place is on.
	Instance   string
	Generation uint64
}

func (d *Deployment) grant(in *instance) *Place {
	in.live++
	d.granted()
	return &Place{d: d, in: in, Instance: in.id, Generation: in.gen, at: d.c.cfg.Now()}
}

// Done frees the place: the request ended and the engine is done with it
// (or never had it).
func (p *Place) Done() {
	d := p.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.done {
		return
	}
	p.done = true
	p.in.live--
	d.observeHold(d.c.cfg.Now().Sub(p.at))
	d.dispatch()
}

// Cut ends the request without freeing the place: it stays held until the
// evidence of kind arrives (SettleNow frees it at once).
func (p *Place) Cut(kind Settle) *Pending {
	d := p.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.done {
		return nil
	}
	p.done = true
	p.in.live--
	if kind == SettleNow {
		d.dispatch()
		return nil
	}
	d.turnCheck()
	pe := &Pending{d: d, in: p.in, Kind: kind, Generation: p.Generation, At: d.c.cfg.Now()}
	p.in.pending = append(p.in.pending, pe)
	d.saturation()
	return pe
}

// Failed ends a request the engine answered with an error: its place
// settles on the engine's idle reading, or at once when the engine has no
// idle signal (an answer, even an error, is the engine's own end of it).
func (p *Place) Failed() {
	if pe := p.Cut(SettleWhenIdle); pe != nil {
		p.d.mu.Lock()
		pe.answered = true
		p.d.mu.Unlock()
	}
}

// Pending is a cut request waiting for evidence that the engine stopped
// working on it.
type Pending struct {
	d  *Deployment
	in *instance
	// answered is set for an error answer (see Place.Failed).
	answered bool
	// Kind is the evidence it waits for.
	Kind Settle
	// Generation is the launch it was sent to.
	Generation uint64
	// At is when it was cut.
	At      time.Time
	settled bool
}

// Settle frees the place: the evidence arrived.
func (pe *Pending) Settle() {
	d := pe.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settleOne(pe) {
		d.dispatch()
	}
}

// Downgrade changes what a pending request waits for (an abort that could
// not be sent waits for the idle reading or the next stop instead).
func (pe *Pending) Downgrade(kind Settle) {
	d := pe.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if pe.settled {
		return
	}
	if kind == SettleNow {
		if d.settleOne(pe) {
			d.dispatch()
		}
		return
	}
	pe.Kind = kind
	d.saturation()
}

func (d *Deployment) settleOne(pe *Pending) bool {
	if pe.settled {
		return false
	}
	pe.settled = true
	pe.in.pending = slices.DeleteFunc(pe.in.pending, func(x *Pending) bool { return x == pe })
	return true
}

// settleAll settles every pending request of an instance; d.mu is held.
func (d *Deployment) settleAll(in *instance) {
	for _, pe := range in.pending {
		pe.settled = true
	}
	in.pending = nil
}

// SettleIdle settles the requests of an instance waiting for an idle
// reading that were cut at least Transit before the reading began, and
// returns how many.
func (d *Deployment) SettleIdle(instanceID string, readingStarted time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.find(instanceID)
	if in == nil {
		return 0
	}
	n := 0
	in.pending = slices.DeleteFunc(in.pending, func(pe *Pending) bool {
		if pe.Kind == SettleWhenIdle && pe.At.Add(d.c.cfg.Transit).Before(readingStarted) {
			pe.settled = true
			n++
			return true
		}
		return false
	})
	if n > 0 {
		d.dispatch()
	}
	return n
}

// NoIdleSignal turns the idle waits of an instance into waits for its next
// stop: its engine has no idle signal.
func (d *Deployment) NoIdleSignal(instanceID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.find(instanceID)
	if in == nil {
		return
	}
	n := len(in.pending)
	in.pending = slices.DeleteFunc(in.pending, func(pe *Pending) bool {
		if pe.Kind != SettleWhenIdle {
			return false
		}
		if pe.answered {
			pe.settled = true
			return true
		}
		pe.Kind = SettleAtStop
		return false
	})
	if len(in.pending) != n {
		d.dispatch()
	}
	d.saturation()
}

// Stopped settles everything an instance's launches up to generation held:
// the engine stopped (or restarted).
func (d *Deployment) Stopped(instanceID string, generation uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.find(instanceID)
	if in == nil {
		return
	}
	n := len(in.pending)
	in.pending = slices.DeleteFunc(in.pending, func(pe *Pending) bool {
		if pe.Generation <= generation {
			pe.settled = true
			return true
		}
		return false
	})
	if len(in.pending) != n {
		in.saturated = false
		d.dispatch()
	}
}

// saturation calls OnSaturated when requests wait (or would) and every
// place of a ready instance is held by requests that settle at its next
// stop; d.mu is held.
func (d *Deployment) saturation() {
	if len(d.queue) == 0 {
		return
	}
	d.checkSaturated()
}

func (d *Deployment) checkSaturated() {
	cb := d.c.cfg.OnSaturated
	for _, in := range d.instances {
		if !in.ready || in.saturated || in.live > 0 || len(in.pending) < d.places {
			continue
		}
		stop := 0
		for _, pe := range in.pending {
			if pe.Kind == SettleAtStop {
				stop++
			}
		}
		if stop == 0 {
			continue
		}
		in.saturated = true
		if cb != nil {
			name, id := d.name, in.id
			d.c.goCallback(func() { cb(name, id) })
		}
	}
}

// Waiter is a request waiting in a deployment's line.
type Waiter struct {
	d       *Deployment
	at      time.Time
	bytes   int64
	ch      chan struct{}
	place   *Place
	left    bool
	counted bool
	// key, tag and seq place it in the fair line (fair.go).
	key string
	tag float64
	seq uint64
}

// Enter admits a request of size bytes for no key in particular (Fair's
// zero value): see EnterFor.
func (d *Deployment) Enter(bytes int64) (*Place, *Waiter, error) { return d.EnterFor(bytes, Fair{}) }

// EnterFor admits a request of size bytes for f's key: it gets a place at
// once when one is free, nobody waits ahead of it and the deployment's turn
// has not ended; otherwise it joins the line in its key's fair order and
// gets a Waiter (its next turn serves the line in that order too), or is
// refused with queue_full when the line is at a bound.
func (d *Deployment) EnterFor(bytes int64, f Fair) (*Place, *Waiter, error) {
	d.mu.Lock()
	d.arrived(d.c.cfg.Now())
	if len(d.queue) == 0 && d.granting() {
		if in := d.pick(); in != nil {
			p := d.grant(in)
			d.mu.Unlock()
			return p, nil, nil
		}
	}
	defer d.mu.Unlock()
	if len(d.queue) >= d.maxWaiting {
		d.checkSaturated()
		return nil, nil, d.full("%d requests wait for deployment %s, its limit (limits.max_waiting)", len(d.queue), d.name)
	}
	c := d.c
	c.mu.Lock()
	if c.waiting >= c.cfg.MaxWaitingTotal {
		n := c.waiting
		c.mu.Unlock()
		return nil, nil, d.full("%d requests wait, the role's limit (limits.max_waiting_total)", n)
	}
	if c.waitingBytes+bytes > c.cfg.MaxWaitingBytes {
		c.mu.Unlock()
		return nil, nil, d.full("the waiting requests' bodies would exceed %s (limits.max_waiting_bytes)", structs.FormatBytes(c.cfg.MaxWaitingBytes))
	}
	c.waiting++
	c.waitingBytes += bytes
	c.mu.Unlock()
	w := &Waiter{d: d, at: c.cfg.Now(), bytes: bytes, ch: make(chan struct{}), counted: true}
	d.enqueue(w, f)
	d.checkSaturated()
	return nil, w, nil
}

func (d *Deployment) full(format string, args ...any) error {
	e := structs.Errf(structs.CodeQueueFull, format, args...)
	e.RetryAfter = 1
	return e
}

// uncount removes a waiter from the totals; d.mu is held.
func (d *Deployment) uncount(w *Waiter) {
	if !w.counted {
		return
	}
	w.counted = false
	c := d.c
	c.mu.Lock()
	c.waiting--
	c.waitingBytes -= w.bytes
	c.mu.Unlock()
}

// dispatch hands free places to waiters in order while the deployment's
// turn lets it; d.mu is held.
func (d *Deployment) dispatch() {
	defer d.turnCheck()
	for len(d.queue) > 0 && d.granting() {
		in := d.pick()
		if in == nil {
			d.checkSaturated()
			return
		}
		w := d.queue[0]
		d.queue[0] = nil
		d.queue = d.queue[1:]
		d.uncount(w)
		d.served(w)
		w.place = d.grant(in)
		close(w.ch)
	}
}

// C is closed when the waiter is granted a place.
func (w *Waiter) C() <-chan struct{} { return w.ch }

// Place returns the place granted (after C is closed).
func (w *Waiter) Place() *Place {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.place
}

// Position returns how many requests wait ahead of this one (-1 once it
// left the line).
func (w *Waiter) Position() int {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return slices.Index(w.d.queue, w)
}

// Leave takes the waiter out of the line (the client went away, or its
// deadline passed). A place granted meanwhile is freed.
func (w *Waiter) Leave() {
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.left {
		return
	}
	w.left = true
	if w.place != nil {
		if !w.place.done {
			w.place.done = true
			w.place.in.live--
		}
		d.dispatch()
		return
	}
	d.queue = slices.DeleteFunc(d.queue, func(x *Waiter) bool { return x == w })
	d.uncount(w)
	d.idleLine()
	d.turnCheck()
}

// Counts is a deployment's admission figures.
type Counts struct {
	// Places is the running places per instance.
	Places int `json:"places"`
	// MaxWaiting bounds the line.
	MaxWaiting int `json:"max_waiting"`
	// Waiting requests are in the line.
	Waiting int `json:"waiting"`
	// Live requests hold a place and are being served.
	Live int `json:"in_flight"`
	// SettleWhenIdle, SettleAtStop and SettleOnAbort count cut requests
	// still holding a place, by the evidence they wait for.
	SettleWhenIdle int `json:"settle_when_idle"`
	SettleAtStop   int `json:"settle_at_stop"`
	SettleOnAbort  int `json:"settle_on_abort"`
	// Instances are the figures per instance.
	Instances []InstanceCounts `json:"instances,omitempty"`
	// Turn is "open", "ending" (another model waits for its memory: it
	// serves its line, then closes) or "ended" (it grants nothing until it
	// is ready again after a switch).
	Turn string `json:"turn,omitempty"`
}

// InstanceCounts is one instance's figures.
type InstanceCounts struct {
	ID             string `json:"id"`
	Generation     uint64 `json:"generation"`
	Ready          bool   `json:"ready"`
	Live           int    `json:"in_flight"`
	SettleWhenIdle int    `json:"settle_when_idle"`
	SettleAtStop   int    `json:"settle_at_stop"`
	SettleOnAbort  int    `json:"settle_on_abort"`
}

// Unsettled is the number of cut requests still holding a place.
func (ic InstanceCounts) Unsettled() int {
	return ic.SettleWhenIdle + ic.SettleAtStop + ic.SettleOnAbort
}

// Counts returns the deployment's figures.
func (d *Deployment) Counts() Counts {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := Counts{Places: d.places, MaxWaiting: d.maxWaiting, Waiting: len(d.queue), Turn: d.turn.gate.String()}
	for _, in := range d.instances {
		ic := InstanceCounts{ID: in.id, Generation: in.gen, Ready: in.ready, Live: in.live}
		for _, pe := range in.pending {
			switch pe.Kind {
			case SettleWhenIdle:
				ic.SettleWhenIdle++
			case SettleAtStop:
				ic.SettleAtStop++
			case SettleOnAbort:
				ic.SettleOnAbort++
			}
		}
		out.Live += ic.Live
		out.SettleWhenIdle += ic.SettleWhenIdle
		out.SettleAtStop += ic.SettleAtStop
		out.SettleOnAbort += ic.SettleOnAbort
		out.Instances = append(out.Instances, ic)
	}
	return out
}

// Instance returns one instance's figures.
func (d *Deployment) Instance(id string) (InstanceCounts, bool) {
	for _, ic := range d.Counts().Instances {
		if ic.ID == id {
			return ic, true
		}
	}
	return InstanceCounts{}, false
}
