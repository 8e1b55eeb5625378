// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// ParkDeployment parks every ready instance of a deployment at its
// residency; a restart-only instance is stopped instead. The deployment's
// desired state is unchanged: the next request wakes (or starts) it.
func (m *Manager) ParkDeployment(ctx context.Context, name string, wait bool) error {
	m.mu.Lock()
	d, ok := m.deployments[name]
	var insts []*instance
	if ok {
		insts = append(insts, d.instances...)
	}
	m.mu.Unlock()
	if !ok {
		return structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	run := func(ctx context.Context) error {
		var first error
		for _, in := range insts {
			if err := in.do(ctx, cmdPark, "operator park"); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	if wait {
		return run(ctx)
	}
	// The caller's context ends with its answer; the park goes on.
	m.goTracked(func() { _ = run(m.ctx) })
	return nil
}

// StartInstance starts (or wakes) one instance.
func (m *Manager) StartInstance(ctx context.Context, name string, idx int, opts StartOptions) error {
	in, err := m.instance(name, idx)
	if err != nil {
		return err
	}
	c := &command{kind: cmdStart, why: "operator start", evict: opts.Evict, done: make(chan error, 1)}
	if opts.Wait {
		return in.send(ctx, c)
	}
	m.goTracked(func() { _ = in.send(m.ctx, c) })
	return nil
}

// StopInstance stops one instance (the deployment's desired state is kept).
func (m *Manager) StopInstance(ctx context.Context, name string, idx int, wait bool) error {
	in, err := m.instance(name, idx)
	if err != nil {
		return err
	}
	in.abortStartup()
	if wait {
		return in.do(ctx, cmdStop, "operator stop")
	}
	m.goTracked(func() { _ = in.do(m.ctx, cmdStop, "operator stop") })
	return nil
}

// ParkInstance parks one instance.
func (m *Manager) ParkInstance(ctx context.Context, name string, idx int, wait bool) error {
	in, err := m.instance(name, idx)
	if err != nil {
		return err
	}
	if wait {
		return in.do(ctx, cmdPark, "operator park")
	}
	m.goTracked(func() { _ = in.do(m.ctx, cmdPark, "operator park") })
	return nil
}

// canPark reports whether an instance parks (rather than stops) at its
// residency.
func (in *instance) canPark(rec structs.InstanceRecord) bool {
	switch rec.Residency {
	case structs.ResidencyDeep, structs.ResidencyHostBacked:
	default:
		return false
	}
	desc, err := in.m.cfg.Drivers.Describe(in.m.ctx, rec.Driver)
	if err != nil {
		return false
	}
	return contains(desc.Capabilities.ParkTiers, rec.Residency)
}

// park drains the instance and parks it, or stops it when it is restart
// only, when cut requests settle only at its next stop, or when its parked
// footprint does not fit. forSwitch records the reason as a switch.
func (in *instance) park(why string, forSwitch bool) error {
	rec := in.snapshot()
	switch rec.State {
	case structs.StateParked, structs.StateStopped, structs.StateFailed:
		return nil
	case structs.StateReady:
	default:
		return structs.Errf(structs.CodeConflict, "instance %s is %s, not ready", in.id, rec.State)
	}
	m := in.m
	reqs := m.cfg.Requests
	if !in.canPark(rec) {
		if rec.LMCache != nil && rec.Residency == structs.ResidencyRestartOnly {
			// Its engine stops; its LMCache server, and the cache, stay.
			return in.parkKeepingLMCache(why, forSwitch)
		}
		return in.stopReleased(why, "stopped (restart only)")
	}
	if reqs.SettleAtStop(in.id) > 0 {
		// IMPORTANT: requests cut before the engine answered settle only at
		// its next stop; parking would keep them counted for ever.
		return in.stopReleased(why, "stopped (requests settle at stop)")
	}
	if err := in.drain(why); err != nil {
		return err
	}
	placer := m.placer()
	tier, phase, err := in.chargeParked(rec, placer)
	if err != nil {
		// No parked footprint fits: stop instead.
		m.logger.Info("parked footprint does not fit; stopping instead", "instance", in.id, "error", err)
		return in.stopReleased(why, "stopped (no room to park)")
	}
	if err := in.transition(structs.StateParking, why, nil); err != nil {
		return err
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return in.parkFailed(why, err)
	}
	group := m.isGroupMember(in.dep)
	ctx, cancel := context.WithTimeout(m.ctx, 2*time.Minute)
	resp, err := drv.Park(ctx, &sdk.ParkRequest{InstanceID: in.id, Tier: tier})
	if err == nil && group {
		// A group member's park completes once its own rank proves it
		// released its memory (the head's sleep acts on every rank).
		err = in.proveReleased(ctx)
	}
	cancel()
	if err != nil {
		return in.parkFailed(why, driverErr(err, "park"))
	}
	released := "parked"
	if forSwitch {
		released = "parked (switch)"
	}
	if err := in.transition(structs.StateParked, why, func(r *structs.InstanceRecord) {
		r.Phase = phase
		r.Released = released
		r.ParkTier = tier
		r.ParkDetail = resp.Detail
	}); err != nil {
		return err
	}
	if pm, ok := placer.(interface{ Parked(owner string) }); ok {
		pm.Parked(in.id)
	}
	return nil
}

// parkFailed stops an instance whose park failed: its memory state is
// unknown, so it is not served again.
func (in *instance) parkFailed(why string, err error) error {
	e := structs.AsError(err)
	in.update(func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: structs.CodeParkFailed, Message: e.Message, At: in.m.cfg.Now().UTC()}
	})
	if serr := in.stopReleased(why, "stopped (park failed)"); serr != nil {
		return serr
	}
	return structs.Errf(structs.CodeParkFailed, "park of %s failed and it was stopped: %s", in.id, e.Message)
}

// stopReleased stops the instance and records why it released its memory.
func (in *instance) stopReleased(why, released string) error {
	if err := in.stop(why); err != nil {
		return err
	}
	in.update(func(r *structs.InstanceRecord) { r.Released = released })
	return nil
}

// drain closes routing to a ready instance and waits until its requests
// ended (bounded by the drain timeout). The last ready instance of a
// deployment first keeps admitting for the admission window, ending early
// once it is idle.
func (in *instance) drain(why string) error {
	m := in.m
	reqs := m.cfg.Requests
	if reqs.Active(in.id) > 0 && in.lastReady() {
		deadline := m.cfg.Now().Add(m.cfg.AdmissionWindow)
		for reqs.Active(in.id) > 0 && m.cfg.Now().Before(deadline) {
			if !in.pause(10 * time.Millisecond) {
				return structs.Errf(structs.CodeShuttingDown, "shutting down")
			}
		}
	}
	if err := in.transition(structs.StateDraining, why, nil); err != nil {
		return err
	}
	deadline := m.cfg.Now().Add(m.cfg.DrainTimeout)
	interval := 2 * time.Millisecond
	for reqs.Active(in.id) > 0 {
		if m.cfg.Now().After(deadline) {
			_ = in.transition(structs.StateReady, "drain timed out", nil)
			return structs.Errf(structs.CodeUnavailable,
				"instance %s still had %d requests after the %s drain timeout; it serves again", in.id, reqs.Active(in.id), m.cfg.DrainTimeout)
		}
		if !in.pause(interval) {
			return structs.Errf(structs.CodeShuttingDown, "shutting down")
		}
		if interval < 100*time.Millisecond {
			interval *= 2
		}
	}
	return nil
}

// pause waits d unless the manager closes; false when closing.
func (in *instance) pause(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-in.m.ctx.Done():
		return false
	}
}

// lastReady reports whether this is the deployment's only ready instance.
func (in *instance) lastReady() bool {
	r := in.m.Routes().Lookup(in.dep)
	if r == nil {
		for _, route := range in.m.Routes().List() {
			if route.Deployment == in.dep {
				r = route
			}
		}
	}
	return r == nil || len(r.Ready) <= 1
}

// wake restores a parked instance, proves it with the wake check, and
// serves it again; a failed wake or a different answer stops it (for the
// lane's command c: why, and whether it may evict to make room).
func (in *instance) wake(c *command) error {
	why, evict := c.why, c.evict
	rec := in.snapshot()
	if rec.State != structs.StateParked {
		return structs.Errf(structs.CodeConflict, "instance %s is %s, not parked", in.id, rec.State)
	}
	m := in.m
	placer := m.placer()
	if err := m.withRoom(m.ctx, in, evict, func() error { return placer.Phase(in.id, ledger.PhaseReady) }); err != nil {
		// Refused before it changed the state (no room): the record says
		// so, as a stopped instance's start does (a server waiting for the
		// host's verdict reads it).
		e := structs.AsError(err)
		in.update(func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: m.cfg.Now().UTC()}
		})
		return err
	}
	if err := in.transition(structs.StateWaking, why, nil); err != nil {
		return err
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return in.wakeFailed(why, structs.CodeWakeFailed, err.Error())
	}
	timeout := 5 * time.Minute
	if dr, ok := m.spec(in.dep); ok && dr.Spec.Timeouts.Wake > 0 {
		timeout = dr.Spec.Timeouts.Wake.D()
	}
	ctx, cancel := context.WithTimeout(m.ctx, timeout)
	resp, err := drv.Wake(ctx, &sdk.WakeRequest{InstanceID: in.id, Tier: parkTierOf(rec)})
	cancel()
	if err != nil {
		return in.wakeFailed(why, structs.CodeWakeFailed, structs.AsError(driverErr(err, "wake")).Message)
	}
	if rec.Canary != "" && resp.Canary != rec.Canary {
		return in.wakeFailed(why, structs.CodeWakeMismatch,
			fmt.Sprintf("the woken model answered the wake check %q, not %q as at its first start", resp.Canary, rec.Canary))
	}
	return in.transition(structs.StateReady, why, func(r *structs.InstanceRecord) {
		r.Phase = ledger.PhaseReady
		r.Released = ""
		r.ParkTier, r.ParkDetail = "", ""
	})
}

// parkTiers are the tiers a park of the instance may take, the preferred
// first. Where the driver picks the tier at each park (tier_per_park:
// vLLM's sleep levels), the card is discrete and the deployment's residency
// leaves the choice (the engine's default, or host_backed, which then falls
// back to deep rather than stopping): host_backed (the weights kept in host
// RAM, level 1: a wake copies them back) before deep (the weights dropped,
// level 2: a wake reloads them from disk). A residency of deep declared by
// the operator parks deep only; any other driver, and a group's member,
// parks at the residency it launched with.
func (in *instance) parkTiers(rec structs.InstanceRecord) []string {
	desc, err := in.m.cfg.Drivers.Describe(in.m.ctx, rec.Driver)
	if err != nil || !desc.Capabilities.TierPerPark || in.m.isGroupMember(in.dep) {
		// IMPORTANT: a group's members park at one tier (the head's sleep
		// acts on every rank): the residency it launched with.
		return []string{rec.Residency}
	}
	offered := desc.Capabilities.ParkTiers
	declared := ""
	if dr, ok := in.m.spec(in.dep); ok {
		declared = dr.Spec.Residency
	}
	unified := in.m.cfg.Host.Policy != nil && in.m.cfg.Host.Policy.Unified
	var out []string
	if !unified && declared != structs.ResidencyDeep && contains(offered, structs.ResidencyHostBacked) {
		out = append(out, structs.ResidencyHostBacked)
	}
	if contains(offered, structs.ResidencyDeep) {
		out = append(out, structs.ResidencyDeep)
	}
	if len(out) == 0 {
		out = []string{rec.Residency}
	}
	return out
}

// chargeParked moves the instance's ledger charge to the first of its park
// tiers that fits: the ledger decides, in one step, whether host RAM has
// room for the weights (parked_host) or the park drops them (parked).
func (in *instance) chargeParked(rec structs.InstanceRecord, placer Placer) (tier, phase string, err error) {
	for _, t := range in.parkTiers(rec) {
		phase = ledger.PhaseParked
		if t == structs.ResidencyHostBacked {
			phase = ledger.PhaseParkedHost
		}
		if err = placer.Phase(in.id, phase); err == nil {
			return t, phase, nil
		}
		in.m.logger.Info("park tier does not fit", "instance", in.id, "tier", t, "error", err)
	}
	return "", "", err
}

// wakeFailed stops an instance whose wake failed instead of serving it.
func (in *instance) wakeFailed(why string, code structs.Code, msg string) error {
	m := in.m
	e := structs.Errf(code, "wake of %s: %s; the instance was stopped and starts again on the next request", in.id, msg)
	in.update(func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: code, Message: e.Message, At: m.cfg.Now().UTC()}
	})
	if err := in.stop(why + " (wake failed)"); err != nil {
		return err
	}
	in.update(func(r *structs.InstanceRecord) {
		r.Released = "stopped (wake failed)"
		r.LastError = &structs.ErrorRecord{Code: code, Message: e.Message, At: m.cfg.Now().UTC()}
	})
	m.event("wake_failed", in.dep, in.id, map[string]any{"code": string(code)})
	return e
}

// placer returns the configured placer or one that admits everything.
func (m *Manager) placer() Placer {
	if m.cfg.Placer == nil {
		return noPlacer{}
	}
	return m.cfg.Placer
}
