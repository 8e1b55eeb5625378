// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"math"
	"sort"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
)

// What a switch expects a step to take, and what evicting a model costs.
//
// A step's duration is the instance's own measurement (timings.go), or the
// measurement of another instance of its deployment; before any, it is
// estimated from the memory the ledger charges the model:
//
//	start         10 s + ready bytes at 1 GiB/s
//	wake (deep)   1 s + ready bytes at 2 GiB/s (weights reloaded from disk)
//	wake (host)   0.3 s + ready bytes at 10 GiB/s (copied back from host RAM)
//	park          0.5 s
//	stop          2 s
//
// and, with no charge known either, 30 s to start and 5 s to wake.
//
// The expected cost of evicting a victim, in seconds of waiting it causes:
//
//	cost = max(bring_back × recent, rate × turn_time × (bring_back + out))
//	       + bring_back × (waiting + in_flight) + drain
//
// where bring_back is the time to have it serve again (its wake when it
// would park, its start when it would stop; for a parked one, what a start
// costs beyond a wake), recent = 60 s / (60 s + idle) the chance it is
// asked for again soon (1 when just used, ½ after a minute idle), rate its
// recent requests per second (rate × turn_time are the requests expected
// while another model has its turn, and each waits for the victim's next
// turn: out = turn_time / 2 on average for a ready victim, 0 for a parked
// one, which is out already), waiting and in_flight its requests (each
// waits for it to come back), and drain its mean service time when it
// serves (the requester waits for its requests to end). Ready models come before parked ones (parking a ready
// model frees the most for the least); within each, the cheapest first,
// then the least recently used, then by ID.

// Placeholders of step durations before anything is measured or charged.
const (
	defaultStartEstimate = 30 * time.Second
	defaultWakeEstimate  = 5 * time.Second
	defaultParkEstimate  = 500 * time.Millisecond
	defaultStopEstimate  = 2 * time.Second
	// reuseHorizon is the idle time at which a model's chance of being
	// asked for again soon is one half.
	reuseHorizon = 60 * time.Second
)

// ChargeReader is implemented by placers that can say what an owner is
// charged (the ledger's figures, by domain): a switch uses it to evict only
// victims that free memory where the requester is short, and to estimate
// a step before it was measured.
type ChargeReader interface {
	// Charges returns an owner's charge now and in each phase, by domain;
	// ok is false for an owner the ledger does not hold.
	Charges(owner string) (now map[string]int64, plan map[string]map[string]int64, ok bool)
}

// readyBytes is an instance's ready charge, all domains together (0 when
// unknown).
func (m *Manager) readyBytes(in *instance) int64 {
	cr, ok := m.cfg.Placer.(ChargeReader)
	if !ok {
		return 0
	}
	_, plan, ok := cr.Charges(in.id)
	if !ok {
		return 0
	}
	var n int64
	for _, b := range plan[ledger.PhaseReady] {
		n += b
	}
	return n
}

// timingsOf returns the measured timings of an instance, or of another
// instance of its deployment when it has none.
func (m *Manager) timingsOf(in *instance) *structs.Timings {
	if t := in.snapshot().Timings; t != nil {
		return t
	}
	for _, o := range m.allInstances() {
		if o.dep == in.dep && o != in {
			if t := o.snapshot().Timings; t != nil {
				return t
			}
		}
	}
	return nil
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// bytesAt is the time to move b bytes at rate bytes per second.
func bytesAt(b int64, rate float64) time.Duration {
	return time.Duration(float64(b) / rate * float64(time.Second))
}

// expectStart is what a cold start of the instance is expected to take.
func (m *Manager) expectStart(in *instance) time.Duration {
	if t := m.timingsOf(in); t != nil && t.StartMs > 0 {
		return ms(t.StartMs)
	}
	if b := m.readyBytes(in); b > 0 {
		return 10*time.Second + bytesAt(b, float64(structs.GiB))
	}
	return defaultStartEstimate
}

// expectWake is what a wake of the instance from tier is expected to take.
func (m *Manager) expectWake(in *instance, tier string) time.Duration {
	if t := m.timingsOf(in); t != nil {
		if w := t.WakeMs[tier]; w > 0 {
			return ms(w)
		}
	}
	if b := m.readyBytes(in); b > 0 {
		if tier == structs.ResidencyHostBacked {
			return 300*time.Millisecond + bytesAt(b, 10*float64(structs.GiB))
		}
		return time.Second + bytesAt(b, 2*float64(structs.GiB))
	}
	if t := m.timingsOf(in); t != nil {
		// Another tier's measurement, the slowest (a wake from host RAM
		// is never slower than one from disk).
		var slowest int64
		for _, w := range t.WakeMs {
			slowest = max(slowest, w)
		}
		if slowest > 0 {
			return ms(slowest)
		}
	}
	return defaultWakeEstimate
}

// expectPark is what a park (or, when the instance does not park, a stop)
// is expected to take.
func (m *Manager) expectPark(in *instance, parks bool) time.Duration {
	t := m.timingsOf(in)
	if parks {
		if t != nil && t.ParkMs > 0 {
			return ms(t.ParkMs)
		}
		return defaultParkEstimate
	}
	if t != nil && t.StopMs > 0 {
		return ms(t.StopMs)
	}
	return defaultStopEstimate
}

// expectBringIn is what bringing an instance into memory from its current
// state is expected to take: a wake for a parked one, a start otherwise (0
// for one that serves).
func (m *Manager) expectBringIn(in *instance) time.Duration {
	rec := in.snapshot()
	switch rec.State {
	case structs.StateReady:
		return 0
	case structs.StateParked, structs.StateParking:
		if parkedWithLMCacheOnly(rec) {
			return m.expectStart(in)
		}
		return m.expectWake(in, parkTierOf(rec))
	case structs.StateWaking:
		return m.expectWake(in, parkTierOf(rec))
	}
	return m.expectStart(in)
}

// measuredBringIn is expectBringIn from the instance's (or its
// deployment's) measurements only: 0 when the step was never measured.
func (m *Manager) measuredBringIn(in *instance) time.Duration {
	t := m.timingsOf(in)
	if t == nil {
		return 0
	}
	rec := in.snapshot()
	switch rec.State {
	case structs.StateReady:
		return 0
	case structs.StateParked, structs.StateParking, structs.StateWaking:
		if !parkedWithLMCacheOnly(rec) {
			return ms(t.WakeMs[parkTierOf(rec)])
		}
	}
	return ms(t.StartMs)
}

// measuredPark is expectPark from measurements only (0 when never
// measured).
func (m *Manager) measuredPark(in *instance, parks bool) time.Duration {
	t := m.timingsOf(in)
	if t == nil {
		return 0
	}
	if parks {
		return ms(t.ParkMs)
	}
	return ms(t.StopMs)
}

// parkTierOf is the tier a parked instance woke or will wake from.
func parkTierOf(rec structs.InstanceRecord) string {
	if rec.ParkTier != "" {
		return rec.ParkTier
	}
	if rec.Residency == structs.ResidencyHostBacked {
		return structs.ResidencyHostBacked
	}
	return structs.ResidencyDeep
}

// victim is a candidate of a switch, with what evicting it costs.
type victim struct {
	in   *instance
	rec  structs.InstanceRecord
	dep  string
	cost float64
	// bringBack is the time to have it serve again after the eviction;
	// measured the same from its measurements only (0: never measured).
	bringBack, measured time.Duration
	// parks is true for a ready victim that parks (rather than stops).
	parks bool
	// waiting and active are its requests; busy when it has any.
	waiting, active int
	used            int64
	// frees is what its eviction frees, by domain (nil when unknown).
	frees map[string]int64
}

func (v *victim) busy() bool { return v.waiting > 0 || v.active > 0 }

// costOf weighs a candidate (see the top of this file).
func (m *Manager) costOf(v *victim, now time.Time) {
	reqs := m.cfg.Requests
	v.waiting = reqs.Waiting(v.dep)
	v.active = reqs.Active(v.in.id)
	v.used = v.in.lastUsed.Load()
	switch v.rec.State {
	case structs.StateReady:
		v.measured, v.parks = m.measuredBringBack(v.in, v.rec)
		if v.parks {
			v.bringBack = m.expectWake(v.in, parkTierOf(v.rec))
		} else {
			v.bringBack = m.expectStart(v.in)
		}
	case structs.StateParked:
		v.bringBack = max(m.expectStart(v.in)-m.expectWake(v.in, parkTierOf(v.rec)), 0)
	}
	idle := reuseHorizon * 1000 // never used: as good as idle for ever
	if v.used > 0 {
		idle = max(now.Sub(time.Unix(0, v.used)), 0)
	}
	reuse := float64(reuseHorizon) / float64(reuseHorizon+idle)
	back := v.bringBack.Seconds()
	asked := back * reuse
	// A model asked for often: the requests expected during a turn of
	// another model. Evicting a ready one, each waits for its next turn,
	// on average half the turn plus its bring-back, not its bring-back
	// alone: a model that wakes fast but is asked for all the time costs
	// more to evict than one that wakes slowly and is asked for seldom. (A
	// parked one is out already: stopping it adds only what a start costs
	// beyond a wake.)
	turn := m.turnTime().Seconds()
	out := 0.0
	if v.rec.State == structs.StateReady {
		out = turn / 2
	}
	asked = max(asked, reqs.ArrivalRate(v.dep)*turn*(back+out))
	v.cost = asked + back*(float64(v.waiting)+float64(v.active))
	if v.active > 0 {
		v.cost += reqs.ServiceTime(v.dep).Seconds()
	}
}

// frees computes what evicting a candidate frees, by domain, from the
// ledger's charges (nil when the placer cannot say).
func (m *Manager) freesOf(v *victim) map[string]int64 {
	cr, ok := m.cfg.Placer.(ChargeReader)
	if !ok {
		return nil
	}
	now, plan, ok := cr.Charges(v.in.id)
	if !ok {
		return nil
	}
	out := map[string]int64{}
	after := map[string]int64{}
	if v.rec.State == structs.StateReady && v.parks {
		after = plan[ledger.PhaseParked]
	}
	for d, b := range now {
		if f := b - after[d]; f > 0 {
			out[d] = f
		}
	}
	return out
}

// shortfalls reads what a capacity refusal says is short, by domain (nil
// when it does not say).
func shortfalls(err error) map[string]int64 {
	e := structs.AsError(err)
	sfs, ok := e.Details["shortfalls"].([]ledger.Shortfall)
	if !ok || len(sfs) == 0 {
		return nil
	}
	out := map[string]int64{}
	for _, s := range sfs {
		if s.Short > 0 && s.Short != math.MaxInt64 {
			out[s.Domain] = s.Short
		}
	}
	return out
}

// helps reports whether a victim frees memory in a domain that is short.
func (v *victim) helps(short map[string]int64) bool {
	if short == nil || v.frees == nil {
		return true // unknown: it may
	}
	for d := range short {
		if v.frees[d] > 0 {
			return true
		}
	}
	return false
}

// covers reports whether a victim alone frees all that is short.
func (v *victim) covers(short map[string]int64) bool {
	if short == nil || v.frees == nil {
		return false
	}
	for d, n := range short {
		if v.frees[d] < n {
			return false
		}
	}
	return true
}

// rankVictims orders candidates: ready before parked, then by cost, then
// least recently used, then by ID. With what is short known, a victim that
// frees nothing where it is short is left out, and when one victim alone
// frees enough, the cheapest such comes first (no other model is evicted
// for nothing).
func rankVictims(cands []*victim, short map[string]int64) []*victim {
	out := cands[:0:0]
	for _, v := range cands {
		if v.helps(short) {
			out = append(out, v)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if ca, cb := a.covers(short), b.covers(short); ca != cb {
			return ca
		}
		if pa, pb := a.rec.State == structs.StateParked, b.rec.State == structs.StateParked; pa != pb {
			return !pa
		}
		if a.cost != b.cost {
			return a.cost < b.cost
		}
		if a.used != b.used {
			return a.used < b.used
		}
		return a.in.id < b.in.id
	})
	return out
}
