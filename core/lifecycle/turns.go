// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Switching under load. When a request's model does not fit because other
// models hold the card, its activation becomes a contender: it waits in
// the host's switch queue, ordered by the arrival of the model's
// longest-waiting request (so a model's turn never comes before an older
// request's model), and one contender at a time, the head, makes room:
//
//   - a victim that is idle is evicted at once (parked, or stopped);
//   - a victim that serves or has requests waiting is asked to end its
//     turn (admission's Contend): it serves what comes for it as one batch
//     until it is idle (nothing waits, nothing runs), at most
//     switching.turn_requests more requests, and at the latest until the
//     head's longest-waiting request has waited switching.turn_time; then
//     it admits nothing more, its requests drain, and it is evicted. Requests for it that arrive after
//     its turn ended wait for its next turn;
//   - victims are chosen by expected cost (costs.go).
//
// The head's model is then brought in (woken or started) and is ready
// before it completes the switch; the next contender becomes head as soon
// as the room is made. A model that fits beside the others never waits in
// the queue.

// Switching policies (switching.policy).
const (
	// PolicyTurns waits for busy models' turns to end (the default).
	PolicyTurns = "turns"
	// PolicyImmediate is the policy before turns: only idle models are
	// victims, least recently used first, and a request whose model cannot
	// be placed because every model in the way is busy is refused at once
	// with capacity_blocked (for a load balancer that prefers a refusal to
	// a wait, and as make bench's baseline).
	PolicyImmediate = "immediate"
)

// Defaults of SwitchingConfig.
const (
	DefaultTurnTime = 30 * time.Second
)

// SwitchingConfig is the switching.* settings.
type SwitchingConfig struct {
	// Policy is PolicyTurns (default) or PolicyImmediate.
	Policy string
	// TurnTime bounds a busy model's turn once another model waits: its
	// turn ends at the latest when the other model's longest-waiting
	// request has waited this long (default 30s).
	TurnTime time.Duration
	// TurnRequests bounds the requests a busy model still admits once
	// another model waits (0: no bound but TurnTime).
	TurnRequests int
}

// roomMode says how a start or wake makes room when it does not fit.
type roomMode int

const (
	// roomNone refuses capacity_blocked, naming what could be evicted.
	roomNone roomMode = iota
	// roomIdle evicts idle models only (an operator's start --evict).
	roomIdle
	// roomTurns is a request's activation: it waits for busy models'
	// turns to end (switching.policy = "turns").
	roomTurns
)

// ticket is one contender in the switch queue.
type ticket struct {
	dep string
	// since is the arrival of the deployment's longest-waiting request
	// when it joined (the join itself for an operator's start).
	since  time.Time
	joined time.Time
	// yielded: it gave the head up and lets the others go first until
	// another takes the head or it asks again.
	yielded bool
}

// switchQueue orders the contenders of a host; the head is the one making
// room now.
type switchQueue struct {
	mu      sync.Mutex
	waiting []*ticket
	head    *ticket
	changed chan struct{}
}

// join adds a contender.
func (q *switchQueue) join(dep string, since, now time.Time) *ticket {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := &ticket{dep: dep, since: since, joined: now}
	q.waiting = append(q.waiting, t)
	q.signal()
	return t
}

// signal wakes whoever waits on the queue; q.mu is held.
func (q *switchQueue) signal() {
	if q.changed != nil {
		close(q.changed)
	}
	q.changed = make(chan struct{})
}

// first is the contender whose turn comes next: the oldest request first,
// then the first to join; one that yielded goes after the others; q.mu is
// held.
func (q *switchQueue) first() *ticket {
	var best *ticket
	for _, t := range q.waiting {
		if best == nil || (best.yielded && !t.yielded) ||
			(best.yielded == t.yielded && (t.since.Before(best.since) || (t.since.Equal(best.since) && t.joined.Before(best.joined)))) {
			best = t
		}
	}
	return best
}

// await returns once t is the head (nil), or ctx ended, or the manager
// closes.
func (q *switchQueue) await(ctx context.Context, t *ticket, quit <-chan struct{}) error {
	for {
		q.mu.Lock()
		if q.head == nil && q.first() == t {
			q.head = t
			if !t.yielded {
				// Another took the head: those that yielded are in line
				// again, in their order.
				for _, x := range q.waiting {
					x.yielded = false
				}
			}
			t.yielded = false
			q.mu.Unlock()
			return nil
		}
		if q.changed == nil {
			q.changed = make(chan struct{})
		}
		ch := q.changed
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-quit:
			return structs.Errf(structs.CodeShuttingDown, "shutting down")
		}
	}
}

// yield lets the next contender be the head while t waits for a change;
// t stays in the queue and takes the head again when its turn comes.
func (q *switchQueue) yield(t *ticket) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == t {
		q.head = nil
		t.yielded = true
		q.signal()
	}
}

// leave removes a contender (the head ends its switch).
func (q *switchQueue) leave(t *ticket) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = slices.DeleteFunc(q.waiting, func(x *ticket) bool { return x == t })
	if q.head == t {
		q.head = nil
	}
	q.signal()
}

// before reports whether a switch is under way, or a contender waits whose
// oldest request arrived before since.
func (q *switchQueue) before(since time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head != nil {
		return true
	}
	for _, t := range q.waiting {
		if t.since.Before(since) {
			return true
		}
	}
	return false
}

// waitingSince is when a deployment's longest-waiting request arrived (now
// when none waits).
func (m *Manager) waitingSince(dep string) time.Time {
	if at, ok := m.cfg.Requests.OldestWaiting(dep); ok {
		return at
	}
	return m.cfg.Now()
}

// has reports whether a deployment is a contender.
func (q *switchQueue) has(dep string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.waiting {
		if t.dep == dep {
			return true
		}
	}
	return false
}

// order returns the contenders in the order their turns come (the head
// first).
func (q *switchQueue) order() []ticket {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]ticket, 0, len(q.waiting))
	for _, t := range q.waiting {
		out = append(out, *t)
	}
	head := q.head
	sort.SliceStable(out, func(i, j int) bool {
		if head != nil && (out[i].dep == head.dep) != (out[j].dep == head.dep) {
			return out[i].dep == head.dep
		}
		if !out[i].since.Equal(out[j].since) {
			return out[i].since.Before(out[j].since)
		}
		return out[i].joined.Before(out[j].joined)
	})
	return out
}

// switchRun is one switch: the contender it made room for and what it
// did, completed when that contender is ready.
type switchRun struct {
	dep     string
	joined  time.Time
	victims []string
}

// switchStats are the host's switching figures (metrics and status).
type switchStats struct {
	mu          sync.Mutex
	switches    uint64
	failed      uint64
	swap        time.Duration
	moving      int
	movingSince time.Time
	recent      []time.Time
	turns       map[string]uint64
	reasons     map[string]uint64
	waits       map[string]*WaitSum
}

// WaitSum sums the waits of one deployment's switches.
type WaitSum struct {
	Count   uint64  `json:"count"`
	Seconds float64 `json:"seconds"`
}

// SwitchStats is a snapshot of the host's switching figures.
type SwitchStats struct {
	// Switches counts switches completed (a model brought in by evicting
	// others), Failed those whose model did not become ready.
	Switches uint64 `json:"switches"`
	Failed   uint64 `json:"failed"`
	// LastMinute counts the switches completed in the last minute.
	LastMinute int `json:"switches_last_minute"`
	// SwapSeconds is the wall time the card spent switching: the victims'
	// parks and stops and the incoming model's wake or start.
	SwapSeconds float64 `json:"swap_seconds"`
	// Turns counts the turns that ended because another model waited, by
	// deployment; TurnReasons by why they ended.
	Turns       map[string]uint64 `json:"turns"`
	TurnReasons map[string]uint64 `json:"turn_reasons"`
	// Waits sums how long each deployment waited for its switch (from
	// joining the queue until its room was made).
	Waits map[string]WaitSum `json:"waits"`
	// Queue lists the contenders in the order their turns come.
	Queue []string `json:"queue,omitempty"`
}

// moving counts the instances moving memory for a switch (a victim
// parking or stopping, the incoming model waking or starting): the card
// spends the wall time while any does switching (overlaps counted once).
func (s *switchStats) moveBegan(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.moving == 0 {
		s.movingSince = now
	}
	s.moving++
}

func (s *switchStats) moveEnded(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.moving == 0 {
		return
	}
	s.moving--
	if s.moving == 0 {
		s.swap += now.Sub(s.movingSince)
	}
}

func (s *switchStats) turnEnded(dep, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.turns == nil {
		s.turns, s.reasons = map[string]uint64{}, map[string]uint64{}
	}
	s.turns[dep]++
	s.reasons[why]++
}

func (s *switchStats) waited(dep string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waits == nil {
		s.waits = map[string]*WaitSum{}
	}
	w := s.waits[dep]
	if w == nil {
		w = &WaitSum{}
		s.waits[dep] = w
	}
	w.Count++
	w.Seconds += d.Seconds()
}

// forget drops a deleted deployment's figures (its turns and waits): a
// role that runs for weeks keeps no series for every deployment it ever
// deleted. The totals by reason and the switch counts stay.
func (s *switchStats) forget(dep string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.turns, dep)
	delete(s.waits, dep)
}

func (s *switchStats) done(at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		s.failed++
		return
	}
	s.switches++
	s.recent = append(s.recent, at)
	s.trim(at)
}

// trim drops completions older than a minute; s.mu is held.
func (s *switchStats) trim(now time.Time) {
	i := 0
	for i < len(s.recent) && now.Sub(s.recent[i]) > time.Minute {
		i++
	}
	s.recent = s.recent[i:]
}

// SwitchStats returns the host's switching figures.
func (m *Manager) SwitchStats() SwitchStats {
	s := &m.stats
	s.mu.Lock()
	s.trim(m.cfg.Now())
	out := SwitchStats{
		Switches: s.switches, Failed: s.failed, LastMinute: len(s.recent), SwapSeconds: s.swap.Seconds(),
		Turns: map[string]uint64{}, TurnReasons: map[string]uint64{}, Waits: map[string]WaitSum{},
	}
	for k, v := range s.turns {
		out.Turns[k] = v
	}
	for k, v := range s.reasons {
		out.TurnReasons[k] = v
	}
	for k, v := range s.waits {
		out.Waits[k] = *v
	}
	s.mu.Unlock()
	for _, t := range m.switches.order() {
		out.Queue = append(out.Queue, t.dep)
	}
	return out
}

// switchDone completes a switch once its contender is ready (err nil) or
// gave up.
func (m *Manager) switchDone(in *instance, sw *switchRun, bringIn time.Duration, err error) {
	now := m.cfg.Now()
	payload := map[string]any{"victims": sw.victims, "waited_ms": now.Sub(sw.joined).Milliseconds()}
	if err != nil {
		payload["code"] = string(structs.AsError(err).Code)
		m.stats.done(now, false)
		m.event("switch_failed", in.dep, in.id, payload)
		return
	}
	m.stats.done(now, true)
	payload["bring_in_ms"] = bringIn.Milliseconds()
	m.event("switch_done", in.dep, in.id, payload)
}

// WaitEstimate says what a request for a deployment without a ready
// instance can expect (structs.WaitEstimate): ok is false for an unknown
// deployment or one that serves. The estimate:
//
//	wait = remaining(holders) + Σ over the models ahead (park + bring_in + serve)
//	       + park + bring_in(this model)
//
// where serve(X) = min(turn_time, max(⌈waiting(X)/places(X)⌉ ×
// service(X), least(X))), least(X) what is left of X's least turn (a
// model that came in lately keeps its turn that long, idle or not; from
// measurements only), remaining is the same for the models in the way
// (their waiting and in-flight requests; a model on its way in, its
// bring-in left and its whole least turn), park the longest expected park
// of the models in the way, and bring_in a wake or a start (costs.go).
func (m *Manager) WaitEstimate(dep string) (structs.WaitEstimate, bool) {
	m.mu.Lock()
	d, ok := m.deployments[dep]
	var insts []*instance
	if ok {
		insts = append(insts, d.instances...)
	}
	m.mu.Unlock()
	if !ok || len(insts) == 0 {
		return structs.WaitEstimate{}, false
	}
	for _, in := range insts {
		if in.state() == structs.StateReady {
			return structs.WaitEstimate{}, false
		}
	}
	target := pickActivationTarget(insts)
	est := structs.WaitEstimate{}
	bringIn, bringInM := m.expectBringIn(target), m.measuredBringIn(target)
	reqs := m.cfg.Requests
	turnTime := m.turnTime()
	serve := func(name string, extra int) time.Duration {
		n := reqs.Waiting(name) + extra
		if n == 0 {
			return 0
		}
		places := max(reqs.Places(name), 1)
		rounds := int(math.Ceil(float64(n) / float64(places)))
		return min(time.Duration(rounds)*reqs.ServiceTime(name), turnTime)
	}
	// The models in memory that are not this one: what holds the card.
	var park, parkM, remaining time.Duration
	for _, o := range m.allInstances() {
		if o.dep == dep {
			continue
		}
		rec := o.snapshot()
		switch rec.State {
		case structs.StateReady, structs.StateDraining, structs.StateParking, structs.StateWaking, structs.StateStarting:
		default:
			continue
		}
		if dr, ok := m.spec(o.dep); !ok || dr.Spec.Lifecycle.Warm {
			continue
		}
		if !slices.Contains(est.Holding, o.dep) {
			est.Holding = append(est.Holding, o.dep)
		}
		parks := rec.State != structs.StateReady || o.canPark(rec)
		park = max(park, m.expectPark(o, parks))
		parkM = max(parkM, m.measuredPark(o, parks))
		remaining = max(remaining, min(max(serve(o.dep, reqs.Active(o.id)), m.turnHeld(o, rec)), turnTime))
	}
	sort.Strings(est.Holding)
	// The contenders whose turn comes first.
	queue := m.switches.order()
	mine := -1
	for i, t := range queue {
		if t.dep == dep {
			mine = i
			break
		}
	}
	ahead := queue
	if mine >= 0 {
		ahead = queue[:mine]
	}
	est.Switch = mine >= 0 || len(ahead) > 0 || (len(est.Holding) > 0 && !m.fitsNow(target))
	if !est.Switch {
		elapsed := time.Duration(0)
		if s := target.state(); s == structs.StateStarting || s == structs.StateWaking {
			elapsed = m.cfg.Now().Sub(target.snapshot().Since)
		}
		est.Wait, est.Floor = max(bringIn-elapsed, 0), max(bringInM-elapsed, 0)
		return est, true
	}
	wait, floor := remaining, remaining
	for _, t := range ahead {
		in := m.firstInstance(t.dep)
		if in == nil {
			continue
		}
		// Once in, it keeps its turn at least its least turn.
		rec := in.snapshot()
		back, parks := m.measuredBringBack(in, rec)
		s := min(max(serve(t.dep, 0), m.leastTurn(in, back, parks)), turnTime)
		wait += park + m.expectBringIn(in) + s
		floor += parkM + m.measuredBringIn(in) + s
	}
	est.Ahead = len(ahead)
	est.Wait = wait + park + bringIn
	est.Floor = floor + parkM + bringInM
	return est, true
}

// turnHeld is how long a model in the way is expected to keep its turn at
// least (from measurements only, 0 when never measured): what is left of
// its least turn when it is ready, its bring-in left and its whole least
// turn when it is on its way in, nothing when it is on its way out.
func (m *Manager) turnHeld(in *instance, rec structs.InstanceRecord) time.Duration {
	switch rec.State {
	case structs.StateReady:
		back, parks := m.measuredBringBack(in, rec)
		return max(m.leastTurn(in, back, parks)-m.cfg.Now().Sub(rec.Since), 0)
	case structs.StateStarting, structs.StateWaking:
		back, parks := m.measuredBringBack(in, rec)
		left := max(m.measuredBringIn(in)-m.cfg.Now().Sub(rec.Since), 0)
		return left + m.leastTurn(in, back, parks)
	}
	return 0
}

// Forecaster is implemented by placers that can say whether an instance
// would fit at its ready charge now, beside what is charged.
type Forecaster interface {
	// FitsReady reports whether the owner's ready charge fits now; known
	// is false when the placer has no figures for it yet.
	FitsReady(owner, deployment string) (fits, known bool)
}

// fitsNow reports whether an instance would fit now without a switch (true
// when the placer cannot say).
func (m *Manager) fitsNow(in *instance) bool {
	f, ok := m.cfg.Placer.(Forecaster)
	if !ok {
		return true
	}
	fits, known := f.FitsReady(in.id, in.dep)
	return fits || !known
}

// firstInstance returns a deployment's first instance.
func (m *Manager) firstInstance(dep string) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.deployments[dep]; ok && len(d.instances) > 0 {
		return d.instances[0]
	}
	return nil
}

// turnTime is the turn bound in force.
func (m *Manager) turnTime() time.Duration {
	if t := m.cfg.Switching.TurnTime; t > 0 {
		return t
	}
	return DefaultTurnTime
}
