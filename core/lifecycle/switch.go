// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// errLaneBusy means a victim's lane is performing an effect: it is not idle
// and is skipped.
var errLaneBusy = errors.New("lane busy")

// withRoom runs try (a ledger reservation) and, when it is refused
// capacity_blocked and evict is allowed, makes room by evicting victims one
// at a time, least recently used first, until try succeeds or no victim is
// left. Victims are ready or parked instances of other deployments that are
// not warm, not serving, and not wanted by waiting requests; a ready victim
// parks when its parked footprint fits, else it stops; a parked victim
// stops. One switch runs at a time.
func (m *Manager) withRoom(ctx context.Context, requester *instance, evict bool, try func() error) error {
	err := try()
	if err == nil || !structs.HasCode(err, structs.CodeCapacityBlocked) {
		return err
	}
	if !evict {
		return m.withEvictable(err, requester)
	}
	m.switchMu.Lock()
	defer m.switchMu.Unlock()
	tried := map[string]bool{}
	// A model whose last request is still being settled (its answer sent,
	// its place not yet given back) is waited for, briefly: a request that
	// follows another model's answer at once must not find it "serving".
	settleBy := time.Now().Add(m.cfg.AdmissionWindow) // real time: the requests settle in it
	for {
		if err = try(); err == nil || !structs.HasCode(err, structs.CodeCapacityBlocked) {
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
		after := v.snapshot()
		m.event("switch_released", after.Deployment, v.id, map[string]any{"for": requester.dep, "released": after.Released})
	}
}

// pickVictim chooses the next victim for a requester; busy reports that a
// ready model was passed over only because it holds requests.
func (m *Manager) pickVictim(requester *instance, tried map[string]bool) (victim *instance, busy bool) {
	reqs := m.cfg.Requests
	type cand struct {
		in     *instance
		parked bool
		used   int64
	}
	var cands []cand
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
			continue // IMPORTANT: a model with waiters is never a victim.
		}
		switch rec.State {
		case structs.StateReady:
			if reqs.Active(in.id) > 0 {
				busy = true
				continue
			}
			cands = append(cands, cand{in: in, used: in.lastUsed.Load()})
		case structs.StateParked:
			cands = append(cands, cand{in: in, parked: true, used: in.lastUsed.Load()})
		}
	}
	// Ready victims first (parking one frees the most for the least), then
	// parked ones; least recently used first within each.
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].parked != cands[j].parked {
			return !cands[i].parked
		}
		if cands[i].used != cands[j].used {
			return cands[i].used < cands[j].used
		}
		return cands[i].in.id < cands[j].in.id
	})
	if len(cands) == 0 {
		return nil, busy
	}
	return cands[0].in, busy
}

// busyServing reports whether the instance is ready and holds requests.
func (in *instance) busyServing() bool {
	return in.state() == structs.StateReady && in.m.cfg.Requests != nil && in.m.cfg.Requests.Active(in.id) > 0
}

// evictSelf runs in a victim's lane: it re-checks that the victim may be
// evicted (a read that gates a mutation is decided by the owner), then
// parks it when it is ready (stopping when the parked footprint does not
// fit) or stops it when it is parked.
func (in *instance) evictSelf(why string) error {
	rec := in.snapshot()
	reqs := in.m.cfg.Requests
	if reqs.Waiting(in.dep) > 0 {
		return structs.Errf(structs.CodeConflict, "%s now has waiting requests", in.dep)
	}
	switch rec.State {
	case structs.StateReady:
		if reqs.Active(in.id) > 0 {
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
