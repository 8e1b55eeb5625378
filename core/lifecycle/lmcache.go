// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// An instance's private LMCache server belongs to the instance, not to one
// engine launch (InstanceRecord.LMCache). Its life:
//
//	start (no server)  → a port leased, a directory made, the driver starts
//	                     it beside the engine (StartResponse.lmcache_server)
//	park, restart_only → the engine stops, the server stays: the instance
//	                     is parked, charged the pool and the server's own
//	                     memory (ledger: restart_only parked = beside host)
//	start (parked)     → a new engine launch reconnects to the same server
//	                     on the same port (LaunchContext.lmcache_server)
//	stop, delete, an engine that exits, a failed start, a role restart
//	                   → the server ends with the engine, proven gone,
//	                     before its port and memory are released
//
// IMPORTANT: a server is kept only for the revision that started it: a
// start of another revision (another model, perhaps) ends it first, so a
// cache never answers for a model it was not filled by.

// releasedKeptLMCache is Released of an instance parked by stopping its
// engine and keeping its LMCache server.
const releasedKeptLMCache = "parked (restart only: engine stopped, LMCache kept)"

// parkedWithLMCacheOnly reports whether rec is parked with its engine
// stopped and only its LMCache server running.
func parkedWithLMCacheOnly(rec structs.InstanceRecord) bool {
	return rec.State == structs.StateParked && rec.LMCache != nil && rec.Released == releasedKeptLMCache
}

// parkKeepingLMCache parks a restart_only instance that runs an LMCache
// server: it drains, moves its charge to the parked phase (the pool and the
// server), stops the engine alone and is parked. Its next start launches a
// new engine that reconnects to the kept server. forSwitch records the
// reason as a switch.
func (in *instance) parkKeepingLMCache(why string, forSwitch bool) error {
	m := in.m
	rec := in.snapshot()
	if err := in.drain(why); err != nil {
		return err
	}
	placer := m.placer()
	if err := placer.Phase(in.id, ledger.PhaseParked); err != nil {
		m.logger.Info("parked footprint does not fit; stopping instead", "instance", in.id, "error", err)
		return in.stopReleased(why, "stopped (no room to park)")
	}
	if err := in.transition(structs.StateParking, why, nil); err != nil {
		return err
	}
	in.stopMonitor()
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return in.parkFailed(why, err)
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.StopGrace+30*time.Second)
	resp, err := drv.Stop(ctx, &sdk.StopRequest{InstanceID: in.id, Grace: m.cfg.StopGrace, Launch: toLaunch(rec.Launch)})
	cancel()
	if err == nil && !resp.Gone {
		err = structs.Errf(structs.CodeStillStopping, "the engine could not be proven gone: %s", resp.Detail)
	}
	if err != nil {
		return in.parkFailed(why, driverErr(err, "stop the engine"))
	}
	// The engine is gone: what it held settles, its port goes back.
	m.cfg.Requests.Stopped(in.id, rec.Generation)
	if rec.Launch != nil && rec.Launch.Port != 0 {
		m.cfg.Ports.Release(rec.Launch.Port)
	}
	released := releasedKeptLMCache
	if forSwitch {
		why += " (switch)"
	}
	return in.transition(structs.StateParked, why, func(r *structs.InstanceRecord) {
		r.Phase = ledger.PhaseParked
		r.Released = released
		r.Endpoint = nil
		if r.Launch != nil {
			r.Launch.Port = 0 // released: a later stop must not release it again
		}
	})
}

// endLMCache ends the instance's LMCache server alone and proves it gone,
// then gives back its port and forgets it; false when it could not be
// proven gone (the record stays, so a later stop tries again).
func (in *instance) endLMCache(drv sdk.Driver) bool {
	rec := in.snapshot()
	if rec.LMCache == nil {
		return true
	}
	m := in.m
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.StopGrace+30*time.Second)
	resp, err := drv.Stop(ctx, &sdk.StopRequest{InstanceID: in.id, Grace: m.cfg.StopGrace, LMCacheServer: toLaunch(rec.LMCache)})
	cancel()
	if err != nil || !resp.Gone {
		m.logger.Warn("the LMCache server could not be proven gone", "instance", in.id, "error", err, "detail", resp.Detail)
		return false
	}
	in.forgetLMCache(rec.LMCache)
	return true
}

// forgetLMCache gives back the port of a server proven gone and drops it
// from the record.
func (in *instance) forgetLMCache(s *structs.LaunchRecord) {
	if s.Port != 0 {
		in.m.cfg.Ports.Release(s.Port)
	}
	_ = in.update(func(r *structs.InstanceRecord) {
		r.LMCache = nil
		if r.Launch != nil {
			r.Launch.LMCachePort = 0
		}
	})
}

// leaseLMCachePort gives the launch the instance's LMCache server when the
// plan runs one: the server kept from an earlier launch of the same
// revision, or a new one on a second leased loopback port with a
// directory of its own; the plan with the grant then renders the engine's
// connection to it. A server the plan no longer runs, or one of another
// revision, ends first. IMPORTANT: a start that fails after the ledger
// granted it ends the server (the undo): a failed instance holds no cache;
// one refused before (no room) keeps its kept server and stays parked.
func (r *startRun) leaseLMCachePort() error {
	m, in := r.m, r.in
	rec := in.snapshot()
	runs := r.plan.LMCache.Runs
	if rec.LMCache != nil && (!runs || rec.Revision != r.dr.Revision) {
		if !in.endLMCache(r.drv) {
			return structs.Errf(structs.CodeStillStopping, "the LMCache server of %s from revision %d could not be proven gone", in.id, rec.Revision)
		}
		rec.LMCache = nil
	}
	if !runs {
		return nil
	}
	if rec.LMCache != nil {
		kept := *rec.LMCache
		r.server = &kept
		r.keptServer = true
	} else {
		port, err := m.cfg.Ports.Lease(in.id + " lmcache")
		if err != nil {
			return err
		}
		id := randomID()
		dir := filepath.Join(m.cfg.Host.StateDir, "launches", in.dep, fmt.Sprintf("%d-lmcache-%s", in.idx, id))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			m.cfg.Ports.Release(port)
			return structs.Wrap(structs.CodeInternal, err, "create the LMCache server's directory")
		}
		r.server = &structs.LaunchRecord{LaunchID: id, Port: port, LaunchDir: dir, StartedAt: m.cfg.Now().UTC()}
	}
	r.lmcachePort = r.server.Port
	r.lctx.LMCachePort = int32(r.server.Port)
	r.lctx.LMCacheServer = toLaunch(r.server)
	server := r.server
	r.keep("LMCache port and server", func() {
		if r.keptServer && !r.reserved {
			// Refused before the ledger granted anything (no room now, a
			// driver call that failed): the instance stays parked, charged,
			// with its cache; a later start tries again.
			return
		}
		if in.snapshot().LMCache != nil {
			in.endLMCache(r.drv)
			return
		}
		// Never recorded, so never started: its port and directory go.
		m.cfg.Ports.Release(server.Port)
		if len(server.Processes) == 0 {
			_ = os.RemoveAll(server.LaunchDir)
		}
	})
	return nil
}

// unpark settles an instance whose start from a park with its LMCache
// server failed after the ledger granted it but before it was recorded:
// the server has ended (or ends now) and the charge goes; the instance is
// stopped. A start refused before the grant (no room) leaves it parked.
func (r *startRun) unpark() {
	in := r.in
	if in.state() != structs.StateParked || (r.keptServer && !r.reserved) {
		return // refused before the ledger took the parked charge: still parked
	}
	if rec := in.snapshot(); rec.LMCache != nil {
		drv, err := in.m.cfg.Drivers.Driver(in.m.ctx, rec.Driver)
		if err != nil || !in.endLMCache(drv) {
			return // still parked and charged: a later stop ends it
		}
	}
	in.m.placer().Release(in.id)
	_ = in.transition(structs.StateStopped, "start from the park failed", func(r *structs.InstanceRecord) {
		r.Phase = ""
		r.Released = "stopped (start failed)"
	})
}

// recoverParkedLMCache settles, after a role restart, an instance parked
// with only its LMCache server running: the server is ended and proven
// gone rather than re-attached (its cache is lost; the next request starts
// the instance afresh), and the instance is stopped. After a driver
// relaunch (settle false) there is no engine to re-attach: nothing
// changes.
func (in *instance) recoverParkedLMCache(why string, settle bool) error {
	if !settle {
		return nil
	}
	rec := in.snapshot()
	drv, err := in.m.cfg.Drivers.Driver(in.m.ctx, rec.Driver)
	if err != nil {
		return in.unsettled(err)
	}
	if !in.endLMCache(drv) {
		return in.unsettled(structs.Errf(structs.CodeStillStopping, "the LMCache server of parked %s could not be proven gone", in.id))
	}
	in.release(in.snapshot())
	return in.transition(structs.StateStopped, why+": the parked instance's LMCache server was ended", func(r *structs.InstanceRecord) {
		r.Endpoint = nil
		r.Phase = ""
		r.Released = "stopped (role restart ended its LMCache)"
	})
}
