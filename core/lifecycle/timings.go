// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Every instance measures its own lifecycle steps as its state changes: a
// cold start (starting → ready), a wake by the tier it woke from (waking →
// ready), a park (parking → parked, the drain before it excluded) and a
// stop (stopping → stopped). The figures are kept on the instance record
// (status shows them, a restart keeps them) as moving averages, and are
// what a switch weighs a victim by and what a waiting request is told to
// expect (costs.go).

// observeStep folds the duration of the step that ends with from → to into
// the instance's timings and returns it; 0 for a transition that ends no
// measured step. in.mu is held.
func (in *instance) observeStep(from, to structs.InstanceState, d time.Duration) time.Duration {
	ms := d.Milliseconds()
	var set func(t *structs.Timings)
	switch {
	case from == structs.StateStarting && to == structs.StateReady:
		set = func(t *structs.Timings) { t.StartMs = structs.Blend(t.StartMs, ms) }
	case from == structs.StateWaking && to == structs.StateReady:
		tier := in.rec.ParkTier
		if tier == "" {
			tier = in.rec.Residency
		}
		set = func(t *structs.Timings) {
			if t.WakeMs == nil {
				t.WakeMs = map[string]int64{}
			}
			t.WakeMs[tier] = structs.Blend(t.WakeMs[tier], ms)
		}
	case from == structs.StateParking && to == structs.StateParked:
		set = func(t *structs.Timings) { t.ParkMs = structs.Blend(t.ParkMs, ms) }
	case from == structs.StateStopping && to == structs.StateStopped:
		set = func(t *structs.Timings) { t.StopMs = structs.Blend(t.StopMs, ms) }
	default:
		return 0
	}
	if ms > 0 {
		// IMPORTANT: a copy: snapshots taken before share the old one.
		t := in.rec.Timings.Clone()
		if t == nil {
			t = &structs.Timings{}
		}
		set(t)
		in.rec.Timings = t
	}
	return d
}

// stepDone runs after a transition is published: a ready instance opens
// its deployment's turn again and completes the switch that brought it in;
// the park or stop of a switch's victim, and the bring-in, count as the
// card's time spent switching.
func (in *instance) stepDone(from, to structs.InstanceState, step time.Duration) {
	m := in.m
	now := m.cfg.Now()
	switch to {
	case structs.StateParking, structs.StateStopping, structs.StateWaking, structs.StateStarting:
		forSwitch := in.evicting.Load() || ((to == structs.StateWaking || to == structs.StateStarting) && in.switched.Load() != nil)
		if forSwitch && in.swapping.CompareAndSwap(false, true) {
			m.stats.moveBegan(now)
		}
	default:
		if in.swapping.CompareAndSwap(true, false) {
			m.stats.moveEnded(now)
		}
	}
	switch to {
	case structs.StateReady:
		m.cfg.Requests.Reopen(in.dep)
		if sw := in.switched.Swap(nil); sw != nil {
			m.switchDone(in, sw, step, nil)
		}
	case structs.StateParked, structs.StateStopped:
		if sw := in.switched.Swap(nil); sw != nil {
			m.switchDone(in, sw, step, structs.Errf(structs.CodeUnavailable, "%s did not become ready", in.id))
		}
	case structs.StateFailed:
		if sw := in.switched.Swap(nil); sw != nil {
			m.switchDone(in, sw, step, structs.Errf(structs.CodeActivationFailed, "%s failed", in.id))
		}
	}
}
