// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// idleTimeouts returns a deployment's idle timers (its own, else the
// role's defaults); 0 is off.
func (m *Manager) idleTimeouts(spec *structs.Deployment) (ready, parked time.Duration) {
	ready, parked = spec.Lifecycle.ReadyIdleTimeout.D(), spec.Lifecycle.ParkedIdleTimeout.D()
	if ready == 0 {
		ready = m.cfg.ReadyIdleTimeout
	}
	if parked == 0 {
		parked = m.cfg.ParkedIdleTimeout
	}
	return ready, parked
}

// CheckIdle parks (or stops, when restart only) ready instances idle
// longer than their ready_idle_timeout, and stops parked instances idle
// longer than their parked_idle_timeout. Warm deployments are exempt. The
// role calls it every IdleCheckInterval; tests call it with an injected
// clock.
func (m *Manager) CheckIdle() {
	now := m.cfg.Now()
	reqs := m.cfg.Requests
	for _, in := range m.allInstances() {
		dr, ok := m.spec(in.dep)
		if !ok || dr.Spec.Lifecycle.Warm || dr.Spec.Group != nil { // a group idles as a whole, on the server
			continue
		}
		readyIdle, parkedIdle := m.idleTimeouts(&dr.Spec)
		rec := in.snapshot()
		last := in.lastUsedAt()
		if last.IsZero() || rec.Since.After(last) {
			last = rec.Since
		}
		switch rec.State {
		case structs.StateReady:
			if readyIdle <= 0 || now.Sub(last) < readyIdle || reqs.Active(in.id) > 0 || reqs.Waiting(in.dep) > 0 {
				continue
			}
			m.goTracked(func() {
				_ = in.tryDo(m.ctx, &command{kind: cmdIdlePark, why: "ready_idle_timeout", done: make(chan error, 1)})
			})
		case structs.StateParked:
			if parkedIdle <= 0 || now.Sub(rec.Since) < parkedIdle || reqs.Waiting(in.dep) > 0 {
				continue
			}
			m.goTracked(func() {
				_ = in.tryDo(m.ctx, &command{kind: cmdIdleStop, why: "parked_idle_timeout", done: make(chan error, 1)})
			})
		}
	}
}

// idlePark runs in the lane: re-check idleness, then park (or stop).
func (in *instance) idlePark(why string) error {
	if in.state() != structs.StateReady || in.m.cfg.Requests.Active(in.id) > 0 {
		return nil
	}
	return in.park(why, false)
}

// idleStop runs in the lane: re-check, then stop a parked instance.
func (in *instance) idleStop(why string) error {
	if in.state() != structs.StateParked || in.m.cfg.Requests.Waiting(in.dep) > 0 {
		return nil
	}
	return in.stopReleased(why, "stopped (parked idle)")
}

// runIdleTimers calls CheckIdle every IdleCheckInterval until the manager
// closes.
func (m *Manager) runIdleTimers() {
	t := time.NewTicker(m.cfg.IdleCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			m.CheckIdle()
		}
	}
}
