// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// recover re-attaches to a recorded launch after a core restart (settle
// true: the instance may move to reconciling and its final state is decided
// here) or a driver relaunch (settle false: the state stays unless the
// engine is gone).
func (in *instance) recover(why string, settle bool) error {
	rec := in.snapshot()
	m := in.m
	if rec.Launch == nil || !holdsProcesses(rec.State) {
		return nil
	}
	if parkedWithLMCacheOnly(rec) {
		return in.recoverParkedLMCache(why, settle)
	}
	prior := rec.State
	if settle && prior != structs.StateReconciling {
		if err := in.transition(structs.StateReconciling, why, nil); err != nil {
			return err
		}
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return in.unsettled(err)
	}
	var eng *structs.EngineRecord
	if e, err := m.resolveEngine(rec.Engine); err == nil {
		eng = e
	}
	dr, _ := m.spec(in.dep)
	req := &sdk.RecoverRequest{
		InstanceID: in.id, Launch: *toLaunch(rec.Launch), Host: *m.hostPolicy(eng),
		Context:   sdk.LaunchContext{Port: int32(rec.Launch.Port), LMCachePort: int32(rec.Launch.LMCachePort), LaunchDir: rec.Launch.LaunchDir, InstanceID: in.id, LaunchID: rec.Launch.LaunchID, DeviceUUIDs: rec.Launch.DeviceUUIDs},
		EngineKey: rec.Launch.EngineKey, AdminKey: rec.Launch.AdminKey,
		RecordedState: string(prior),
	}
	if prior == structs.StateParked || prior == structs.StateParking || prior == structs.StateWaking {
		req.ParkTier = rec.Residency
	}
	if eng != nil {
		req.Installation = *ToInstallation(eng)
	}
	if dr.Name != "" {
		modelDir, _ := m.resolveModel(&dr.Spec)
		req.Deployment = *ToDeployment(&dr.Spec, rec.Revision, modelDir)
		if eng != nil {
			req.Deployment.EngineConfigJSON = familyConfig(&dr.Spec, eng.Family)
		}
	}
	ctx, cancel := context.WithTimeout(m.ctx, time.Minute)
	defer cancel()
	resp, err := drv.Recover(ctx, req)
	if err != nil {
		return in.unsettled(driverErr(err, "recover"))
	}
	switch resp.State {
	case sdk.RecoverStateGone:
		in.stopMonitor()
		// Its LMCache server ends too: never an orphan.
		if !in.endLMCache(drv) {
			return in.unsettled(structs.Errf(structs.CodeStillStopping, "the engine of %s is gone, its LMCache server could not be proven gone", in.id))
		}
		in.release(in.snapshot())
		return in.transition(structs.StateStopped, "engine gone: "+resp.Detail, func(r *structs.InstanceRecord) {
			r.Endpoint = nil
			r.Phase = ""
			r.Released = "engine gone"
			if prior == structs.StateReady || prior == structs.StateStarting {
				r.LastError = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: "the engine was gone when re-attached: " + resp.Detail, At: m.cfg.Now().UTC()}
			}
		})
	case sdk.RecoverStateRunning:
	default:
		return in.unsettled(structs.Errf(structs.CodeUnavailable, "re-attach uncertain: %s", resp.Detail))
	}
	ep := toEndpoint(&resp.Endpoint)
	if l := &resp.Launch; len(l.Processes) > 0 {
		// The driver may have found identities the core never recorded.
		in.update(func(r *structs.InstanceRecord) {
			if r.Launch != nil {
				r.Launch.Pgid = int(l.Pgid)
				r.Launch.Processes = fromLaunch(l)
			}
		})
	}
	if settle && resp.Parked {
		// The engine holds its memory released: it is parked, whatever
		// step the restart interrupted (a park that completed, a wake that
		// had not begun).
		phase := ledger.PhaseParked
		if in.snapshot().ParkTier == structs.ResidencyHostBacked {
			phase = ledger.PhaseParkedHost
		}
		in.adopt(phase)
		if err := in.transition(structs.StateParked, "re-attached: the engine is parked", func(r *structs.InstanceRecord) {
			r.Endpoint = ep
			r.Phase = phase
		}); err != nil {
			return err
		}
		in.startMonitor(drv)
		return nil
	}
	if prior == structs.StateStopping {
		// A stop was in progress: finish it, after a restart and after a
		// driver relaunch alike (the driver a stop hung in was replaced:
		// its successor proves the processes gone now).
		if err := in.transition(structs.StateStopping, "finish the stop begun before the "+restartOrRelaunch(settle), nil); err != nil {
			return err
		}
		return in.stop("finish the stop begun before the " + restartOrRelaunch(settle))
	}
	if !settle {
		if ep != nil && in.state() == structs.StateReady {
			in.update(func(r *structs.InstanceRecord) { r.Endpoint = ep })
			m.rebuildRoutes()
		}
		in.startMonitor(drv)
		return nil
	}
	// Prove readiness in this session before serving again.
	pctx, pcancel := context.WithTimeout(m.ctx, 2*time.Minute)
	probe, err := drv.Probe(pctx, &sdk.ProbeRequest{InstanceID: in.id, Kind: sdk.ProbeKindReadiness, Deadline: 90 * time.Second})
	pcancel()
	if err != nil || !probe.Ready {
		if err == nil {
			err = probeFailure(probe, 90*time.Second)
		}
		return in.unsettled(driverErr(err, "readiness after re-attach"))
	}
	if probe.Endpoint.BaseURL != "" {
		ep = toEndpoint(&probe.Endpoint)
	}
	in.adopt(ledger.PhaseReady)
	if err := in.transition(structs.StateReady, "re-attached", func(r *structs.InstanceRecord) {
		r.Endpoint = ep
		r.Phase = ledger.PhaseReady
	}); err != nil {
		return err
	}
	in.startMonitor(drv)
	return nil
}

// adopt tells the placer what a re-attached instance holds, so the ledger
// a restarted core rebuilds charges what is really running.
func (in *instance) adopt(phase string) {
	p := in.m.placer()
	if a, ok := p.(interface {
		Adopt(owner, phase string, rec structs.InstanceRecord)
	}); ok {
		a.Adopt(in.id, phase, in.snapshot())
		return
	}
	if err := p.Phase(in.id, phase); err != nil {
		in.m.logger.Warn("ledger phase after re-attach", "instance", in.id, "error", err)
	}
}

// unsettled records why recovery could not decide; the instance stays
// reconciling and charged.
func (in *instance) unsettled(err error) error {
	e := structs.AsError(err)
	in.update(func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: in.m.cfg.Now().UTC()}
	})
	return err
}

// restartOrRelaunch names what a recovery follows: a role restart (settle)
// or a driver relaunch.
func restartOrRelaunch(settle bool) string {
	if settle {
		return "restart"
	}
	return "driver relaunch"
}
