// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// errRoomWait is the cause of an activation_timeout of a request's
// activation that waited a request's deadline for room (switchTurns): a
// caller still waiting asks again (Activate).
var errRoomWait = errors.New("the wait for room reached a request's deadline")

// errLaneBusy means a victim's lane is performing an effect: it is not idle
// and is skipped.
var errLaneBusy = errors.New("lane busy")

// withRoom runs try (a ledger reservation) and, when it is refused
// capacity_blocked and evict is allowed, makes room by evicting victims.
// How depends on the lane's command (instance.room) and the policy: a
// request's activation under switching.policy = "turns" waits in the
// host's switch queue and ends busy models' turns (switchTurns, turns.go);
// an operator's start --evict, and every start under "immediate", evict
// idle victims only and refuse when only busy ones are left (switchIdle).
func (m *Manager) withRoom(ctx context.Context, requester *instance, evict bool, try func() error) error {
	turns := evict && requester.room == roomTurns && m.policy() == PolicyTurns
	if turns && m.switches.before(m.waitingSince(requester.dep)) {
		// IMPORTANT: an older request's model is making room: this one
		// waits for its turn instead of taking the room being made (a
		// model whose turn just ended would otherwise come straight back).
		return m.switchTurns(ctx, requester, try)
	}
	err := try()
	if err == nil || !structs.HasCode(err, structs.CodeCapacityBlocked) {
		return err
	}
	if !evict {
		return m.withEvictable(err, requester)
	}
	if turns {
		return m.switchTurns(ctx, requester, try)
	}
	return m.switchIdle(ctx, requester, try)
}

// policy is the switching policy in force.
func (m *Manager) policy() string {
	if m.cfg.Switching.Policy == PolicyImmediate {
		return PolicyImmediate
	}
	return PolicyTurns
}

// switchTurns makes room for a request's activation: it joins the switch
// queue, and once its turn comes evicts victims by cost, ending the turns
// of busy ones first (see turns.go). It gives up when no request waits for
// the model any more, and refuses capacity_blocked only when nothing left
// can make room (warm models, groups, or a model larger than the card).
// IMPORTANT: its whole wait is bounded by a request's deadline (roomWait):
// an activation that no request waits for (its requests hung up before it
// joined) would otherwise wait for ever for room that never comes, and its
// lane, held, would hold every later start or stop of its instance.
func (m *Manager) switchTurns(parent context.Context, requester *instance, try func() error) (err error) {
	bound := m.roomWait(requester.dep)
	ctx, cancel := context.WithTimeout(parent, bound)
	defer cancel()
	defer func() {
		// Only the bound's own end: a refusal that came as it passed stays.
		if errors.Is(err, context.DeadlineExceeded) && parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			e := structs.Errf(structs.CodeActivationTimeout,
				"deployment %s waited %s (a request's deadline) for room on host %s and got none; retry",
				requester.dep, bound, m.cfg.Host.Name)
			e.RetryAfter = 1
			e.Cause = fmt.Errorf("%w (%w)", errRoomWait, err)
			err = e
		}
	}()
	reqs := m.cfg.Requests
	joined := m.cfg.Now()
	// wanted: requests wait for the model; when they all went away the
	// switch gives up (an activation without waiters, a test's or one whose
	// requests were answered meanwhile, goes on).
	since, wanted := reqs.OldestWaiting(requester.dep)
	if !wanted {
		since = joined
	}
	tk := m.switches.join(requester.dep, since, joined)
	defer m.switches.leave(tk)
	if err := m.switches.await(ctx, tk, m.ctx.Done()); err != nil {
		return err
	}
	sw := &switchRun{dep: requester.dep, joined: joined}
	// contended are the deployments whose turn this switch ended and did
	// not evict: they serve again when it ends.
	contended := map[string]bool{}
	defer func() {
		for dep := range contended {
			reqs.Reopen(dep)
		}
	}()
	tried := map[string]bool{}
	for {
		changed := m.board.Changed()
		err := try()
		if err == nil {
			m.whileDeployed(requester.dep, func() { m.stats.waited(requester.dep, m.cfg.Now().Sub(joined)) })
			if len(sw.victims) > 0 {
				requester.switched.Store(sw)
			}
			return nil
		}
		if !structs.HasCode(err, structs.CodeCapacityBlocked) {
			return err
		}
		if wanted && reqs.Waiting(requester.dep) == 0 {
			e := structs.Errf(structs.CodeUnavailable, "no request waits for deployment %s any more: the switch gave up", requester.dep)
			e.RetryAfter = 1
			return e
		}
		cands, pending, waiting := m.switchCandidates(requester, tried)
		short := shortfalls(err)
		ranked := rankVictims(cands, short)
		if pending && (len(ranked) == 0 || (short != nil && !ranked[0].covers(short))) {
			// A model is starting, waking, parking or stopping: what it
			// will hold, or free, is known once it is done; until then no
			// model is evicted for only part of the room (it might be
			// evicted for nothing).
			if err := m.awaitChange(ctx, changed, time.Second); err != nil {
				return err
			}
			continue
		}
		if len(ranked) == 0 && waiting {
			// What is in the way belongs to models that wait for their own
			// turn (a parked one holding host RAM): the turn passes to them
			// and comes back once something changed.
			m.switches.yield(tk)
			if err := m.awaitChange(ctx, changed, time.Second); err != nil {
				return err
			}
			if err := m.switches.await(ctx, tk, m.ctx.Done()); err != nil {
				return err
			}
			continue
		}
		if len(ranked) == 0 {
			return m.withEvictable(err, requester)
		}
		v := ranked[0]
		if v.rec.State == structs.StateReady && v.in.lastReady() && !contended[v.dep] {
			// Its turn ends first: it serves what waits for it, then
			// admits nothing more until it is back.
			// An idle model lingers as long as bringing it back was
			// measured to take (never on a placeholder), and one that
			// came in lately until it has had its least turn.
			ended := reqs.Contend(v.dep, m.cfg.Switching.TurnRequests, max(v.measured, m.leastTurnLeft(v)))
			contended[v.dep] = true
			if v.busy() {
				m.event("turn_ending", v.dep, v.in.id, map[string]any{"for": requester.dep, "waiting": v.waiting, "in_flight": v.active})
			}
			if err := m.awaitTurn(ctx, ended, v.dep, since, m.switchAfterTurn(v, requester)); err != nil {
				return err
			}
			if why, served := reqs.TurnEnded(v.dep); v.busy() || served > 0 {
				m.whileDeployed(v.dep, func() { m.stats.turnEnded(v.dep, why) })
				m.event("turn_ended", v.dep, v.in.id, map[string]any{"for": requester.dep, "why": why, "served": served})
			}
			continue // look again: the room may have come meanwhile
		}
		m.event("switch_planned", requester.dep, requester.id, map[string]any{
			"victim": v.in.id, "victim_state": string(v.rec.State), "cost": math.Round(v.cost*1000) / 1000,
			"bring_back_ms": v.bringBack.Milliseconds(), "waiting": v.waiting, "in_flight": v.active,
		})
		c := &command{kind: cmdEvict, why: "switch for " + requester.dep, afterTurn: contended[v.dep], done: make(chan error, 1)}
		if eerr := v.in.tryDo(ctx, c); eerr != nil {
			m.logger.Info("victim not evicted", "victim", v.in.id, "for", requester.id, "error", eerr)
			if errors.Is(eerr, errLaneBusy) {
				if err := m.awaitChange(ctx, changed, 250*time.Millisecond); err != nil {
					return err
				}
				continue
			}
			tried[v.in.id+"@"+string(v.rec.State)] = true
			continue
		}
		// Evicted: its gate stays closed until it is ready again.
		delete(contended, v.dep)
		sw.victims = append(sw.victims, v.in.id)
		after := v.in.snapshot()
		m.event("switch_released", after.Deployment, v.in.id, map[string]any{"for": requester.dep, "released": after.Released, "tier": after.ParkTier})
	}
}

// whileDeployed runs count (a switching figure of dep) only while dep is
// deployed, under m.mu: a delete drops dep from m.deployments under m.mu
// before it forgets dep's figures, so a late count (a switch that chose
// dep before its delete) comes wholly before the forget or not at all,
// and never brings dep's series back for good.
func (m *Manager) whileDeployed(dep string, count func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.deployments[dep]; ok {
		count()
	}
}

// awaitTurn waits until a contended model's turn ended, ending it when the
// longest-waiting request of the switch has waited the turn time less
// after, what the switch still takes once the turn ended
// (switchAfterTurn): so that request waits the turn time in all, its
// switch included, not the turn time and then the switch.
func (m *Manager) awaitTurn(ctx context.Context, ended <-chan struct{}, dep string, since time.Time, after time.Duration) error {
	if left := m.turnTime() - m.cfg.Now().Sub(since) - after; left > 0 {
		t := time.NewTimer(left)
		defer t.Stop()
		select {
		case <-ended:
			return nil
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-m.ctx.Done():
			return structs.Errf(structs.CodeShuttingDown, "shutting down")
		}
	}
	m.cfg.Requests.CloseTurn(dep)
	// Its turn is closed: it ends once what it admitted has drained (a
	// wait bounded like the rest of the switch, by ctx).
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.ctx.Done():
		return structs.Errf(structs.CodeShuttingDown, "shutting down")
	}
}

// roomWait bounds a request's activation's wait for room: a request's
// deadline, the deployment's own when it sets one.
func (m *Manager) roomWait(dep string) time.Duration {
	if dr, ok := m.spec(dep); ok && dr.Spec.RequestDeadline > 0 {
		return dr.Spec.RequestDeadline.D()
	}
	return m.cfg.RequestDeadline
}

// leastTurnFactor is how many times what a switch was measured to cost a
// model's turn lasts at least, idle or not, once it came in: so that
// switching takes at most 1/(1+leastTurnFactor) of the card's time when
// turns end because their models went idle. A turn that another model's
// longest-waiting request bounds (the turn time) may be shorter.
const leastTurnFactor = 4

// leastTurnLeft is what is left of a ready victim's least turn: from when
// it became ready, leastTurnFactor times what bringing it in and parking
// it were measured to take (0 when never measured), at most the turn time.
func (m *Manager) leastTurnLeft(v *victim) time.Duration {
	if v.rec.State != structs.StateReady {
		return 0
	}
	return max(m.leastTurn(v.in, v.measured, v.parks)-m.cfg.Now().Sub(v.rec.Since), 0)
}

// leastTurn is a model's whole least turn: leastTurnFactor times its
// measured bring-back (its wake when it parks, its start when it stops)
// and its measured park or stop, at most the turn time; 0 when its
// bring-back was never measured (never on a placeholder).
func (m *Manager) leastTurn(in *instance, bringBack time.Duration, parks bool) time.Duration {
	if bringBack <= 0 {
		return 0
	}
	return min(leastTurnFactor*(bringBack+m.measuredPark(in, parks)), m.turnTime())
}

// measuredBringBack is what bringing a ready instance back after its
// eviction was measured to take (its wake from the tier it parks at, or
// its start when it cannot park; 0 when never measured), and whether it
// parks.
func (m *Manager) measuredBringBack(in *instance, rec structs.InstanceRecord) (time.Duration, bool) {
	parks := in.canPark(rec)
	t := m.timingsOf(in)
	if t == nil {
		return 0, parks
	}
	if parks {
		return ms(t.WakeMs[parkTierOf(rec)]), true
	}
	return ms(t.StartMs), false
}

// switchAfterTurn is what a switch is measured to take once its victim's
// turn ended: the victim's running requests draining (its mean service
// time), its park (or stop) and the requester's wake (or start), from
// measurements only (a step never measured counts 0, never a placeholder),
// and at most half the turn time, so that a turn keeps at least half of
// it.
func (m *Manager) switchAfterTurn(v *victim, requester *instance) time.Duration {
	d := m.measuredPark(v.in, v.parks) + m.measuredBringIn(requester)
	if v.active > 0 {
		d += m.cfg.Requests.ServiceTime(v.dep)
	}
	return min(d, m.turnTime()/2)
}

// awaitChange waits for the route table to change (an instance's state
// changed) or at most d.
func (m *Manager) awaitChange(ctx context.Context, changed <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-m.ctx.Done():
		return structs.Errf(structs.CodeShuttingDown, "shutting down")
	}
	return nil
}

// switchCandidates returns the victims a switch may evict, weighed: ready
// and parked instances of other deployments that are not warm, not group
// members, and not contenders themselves. pending reports an instance of
// another deployment on its way between states, which may free or take
// memory once it is done; waiting one that holds memory but waits for its
// own turn.
func (m *Manager) switchCandidates(requester *instance, tried map[string]bool) (cands []*victim, pending, waiting bool) {
	now := m.cfg.Now()
	for _, in := range m.allInstances() {
		if in.dep == requester.dep {
			continue
		}
		rec := in.snapshot()
		dr, ok := m.spec(in.dep)
		if !ok || dr.Spec.Lifecycle.Warm || dr.Spec.Group != nil {
			continue // IMPORTANT: a group member parks with its group, by the server
		}
		switch rec.State {
		case structs.StateReady, structs.StateParked:
		case structs.StateStarting, structs.StateWaking, structs.StateDraining, structs.StateParking, structs.StateStopping:
			pending = true
			continue
		default:
			if in.charging.Load() {
				// A start between its reservation and its record (still
				// stopped, already charged): what it holds is known once
				// it moved. IMPORTANT: not any busy lane: a contender
				// waiting in the queue for this switch to end holds
				// nothing, and waiting for it would wait for ever.
				pending = true
			}
			continue
		}
		if tried[in.id+"@"+string(rec.State)] {
			continue
		}
		if m.switches.has(in.dep) {
			waiting = true
			continue // a contender wants in: never a victim
		}
		v := &victim{in: in, rec: rec, dep: in.dep}
		m.costOf(v, now)
		v.frees = m.freesOf(v)
		cands = append(cands, v)
	}
	return cands, pending, waiting
}

// switchIdle makes room by evicting idle victims one at a time until try
// succeeds or no victim is left: least recently used first under the
// immediate policy, by expected cost otherwise. A ready victim parks when
// its parked footprint fits, else it stops; a parked victim stops. One
// switch runs at a time; a model that serves or has requests waiting is
// never a victim, and when only such models are in the way the start is
// refused (capacity_blocked) after the admission window.
func (m *Manager) switchIdle(ctx context.Context, requester *instance, try func() error) error {
	m.switchMu.Lock()
	defer m.switchMu.Unlock()
	tried := map[string]bool{}
	// A model whose last request is still being settled (its answer sent,
	// its place not yet given back) is waited for, briefly: a request that
	// follows another model's answer at once must not find it "serving".
	settleBy := time.Now().Add(m.cfg.AdmissionWindow) // real time: the requests settle in it
	sw := &switchRun{dep: requester.dep, joined: m.cfg.Now()}
	for {
		err := try()
		if err == nil && len(sw.victims) > 0 {
			requester.switched.Store(sw)
		}
		if err == nil || !structs.HasCode(err, structs.CodeCapacityBlocked) {
			return err
		}
		v, busy := m.pickVictim(requester, tried)
		if v == nil && busy && time.Now().Before(settleBy) {
			if !requester.pause(time.Millisecond) {
				return structs.Errf(structs.CodeShuttingDown, "shutting down")
			}
			continue
		}
		if v == nil {
			return m.withEvictable(err, requester)
		}
		vrec := v.snapshot()
		// A victim is tried once per state: a parked victim may be chosen
		// again to be stopped when its residue is still in the way.
		tried[v.id+"@"+string(vrec.State)] = true
		m.event("switch_planned", requester.dep, requester.id, map[string]any{"victim": v.id, "victim_state": string(vrec.State)})
		if eerr := v.tryDo(ctx, &command{kind: cmdEvict, why: "switch for " + requester.dep, done: make(chan error, 1)}); eerr != nil {
			m.logger.Info("victim not evicted", "victim", v.id, "for", requester.id, "error", eerr)
			if (errors.Is(eerr, errLaneBusy) || v.busyServing()) && time.Now().Before(settleBy) {
				// Its lane is finishing an effect (a wake's last steps), or
				// a request of its own just arrived: not a refusal, try it
				// again shortly.
				delete(tried, v.id+"@"+string(vrec.State))
				if !requester.pause(time.Millisecond) {
					return structs.Errf(structs.CodeShuttingDown, "shutting down")
				}
			}
			continue
		}
		sw.victims = append(sw.victims, v.id)
		after := v.snapshot()
		m.event("switch_released", after.Deployment, v.id, map[string]any{"for": requester.dep, "released": after.Released, "tier": after.ParkTier})
	}
}

// pickVictim chooses the next idle victim for a requester; busy reports
// that a ready model was passed over only because it holds requests.
// Under the immediate policy ready victims come before parked ones, least
// recently used first within each (the policy before turns); otherwise by
// expected cost (rankVictims).
func (m *Manager) pickVictim(requester *instance, tried map[string]bool) (chosen *instance, busy bool) {
	reqs := m.cfg.Requests
	now := m.cfg.Now()
	var cands []*victim
	for _, in := range m.allInstances() {
		if in.dep == requester.dep {
			continue
		}
		rec := in.snapshot()
		if tried[in.id+"@"+string(rec.State)] {
			continue
		}
		dr, ok := m.spec(in.dep)
		if !ok || dr.Spec.Lifecycle.Warm || dr.Spec.Group != nil {
			continue // IMPORTANT: a group member parks with its group, by the server
		}
		if reqs.Waiting(in.dep) > 0 {
			continue // IMPORTANT: a model with waiters is never an idle victim.
		}
		switch rec.State {
		case structs.StateReady:
			if reqs.Active(in.id) > 0 {
				busy = true
				continue
			}
		case structs.StateParked:
		default:
			continue
		}
		v := &victim{in: in, rec: rec, dep: in.dep, used: in.lastUsed.Load()}
		if m.policy() == PolicyTurns {
			m.costOf(v, now)
		}
		cands = append(cands, v)
	}
	// Ready victims first (parking one frees the most for the least), then
	// parked ones; by cost (0 under the immediate policy), then least
	// recently used, within each.
	ranked := rankVictims(cands, nil)
	if len(ranked) == 0 {
		return nil, busy
	}
	return ranked[0].in, busy
}

// busyServing reports whether the instance is ready and holds requests.
func (in *instance) busyServing() bool {
	return in.state() == structs.StateReady && in.m.cfg.Requests != nil && in.m.cfg.Requests.Active(in.id) > 0
}

// evictSelf runs in a victim's lane: it re-checks that the victim may be
// evicted (a read that gates a mutation is decided by the owner), then
// parks it when it is ready (stopping when the parked footprint does not
// fit) or stops it when it is parked. A victim whose turn ended (afterTurn)
// is evicted whatever waits for it, its requests drained first; an idle
// victim is refused the moment it has requests.
func (in *instance) evictSelf(why string, afterTurn bool) error {
	rec := in.snapshot()
	reqs := in.m.cfg.Requests
	if !afterTurn && reqs.Waiting(in.dep) > 0 {
		return structs.Errf(structs.CodeConflict, "%s now has waiting requests", in.dep)
	}
	in.evicting.Store(true)
	defer in.evicting.Store(false)
	switch rec.State {
	case structs.StateReady:
		if !afterTurn && reqs.Active(in.id) > 0 {
			return structs.Errf(structs.CodeConflict, "%s is serving", in.id)
		}
		return in.park(why, true)
	case structs.StateParked:
		return in.stopReleased(why, "stopped (no room to stay parked)")
	}
	return structs.Errf(structs.CodeConflict, "%s is %s", in.id, rec.State)
}

// tryDo sends a command only if the lane is idle (not performing an
// effect), and waits for it. A busy lane is skipped, never waited on: a
// switch must not wait on a lane that may itself wait on the switch.
func (in *instance) tryDo(ctx context.Context, c *command) error {
	if in.busy.Load() {
		return errLaneBusy
	}
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case in.cmds <- c:
	case <-in.quit:
		return structs.Errf(structs.CodeShuttingDown, "instance %s is closed", in.id)
	case <-t.C:
		return errLaneBusy
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withEvictable adds to a capacity refusal what could be evicted (H4).
func (m *Manager) withEvictable(err error, requester *instance) error {
	e := structs.AsError(err)
	var names, groups []string
	for _, in := range m.allInstances() {
		if in.dep == requester.dep {
			continue
		}
		dr, ok := m.spec(in.dep)
		if !ok || dr.Spec.Lifecycle.Warm {
			continue
		}
		if s := in.state(); s == structs.StateReady || s == structs.StateParked {
			if dr.Spec.Group != nil {
				// Only the server evicts a group, all of its members.
				groups = append(groups, in.dep)
				continue
			}
			names = append(names, in.id)
		}
	}
	sort.Strings(names)
	sort.Strings(groups)
	if len(groups) > 0 {
		e = e.WithDetail("evictable_groups", groups)
	}
	if len(names) > 0 && !strings.Contains(e.Message, "evict") {
		out := *e
		out.Message = e.Message + "; could be evicted: " + strings.Join(names, ", ") + " (start with --evict)"
		out.WithDetail("evictable", names)
		return &out
	}
	return e
}
