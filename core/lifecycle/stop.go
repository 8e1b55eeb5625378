// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// cleanupLaunch ends whatever a launch left, and the instance's LMCache
// server, proving them gone.
func (in *instance) cleanupLaunch(drv sdk.Driver, r *structs.InstanceRecord) *sdk.StopResponse {
	rec := in.snapshot()
	if r != nil {
		rec = *r
	}
	if rec.Launch == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(in.m.ctx, in.m.cfg.StopGrace+30*time.Second)
	defer cancel()
	launch := toLaunch(rec.Launch)
	if rec.Launch.Pgid == 0 && len(rec.Launch.Processes) == 0 {
		// The driver's Start answered no identities (it failed, or the
		// driver died meanwhile): whatever it spawned wrote them in the
		// launch directory, where the driver's Recover reads them.
		found, gone := in.launchedIdentities(ctx, drv, launch)
		switch {
		case gone && rec.LMCache == nil:
			return &sdk.StopResponse{Gone: true, Detail: "nothing of the launch runs"}
		case gone:
			launch = nil // only the LMCache server is left to end
		case found != nil:
			launch = found
			in.update(func(r *structs.InstanceRecord) {
				if r.Launch != nil && r.Launch.LaunchID == rec.Launch.LaunchID {
					r.Launch.Pgid = int(found.Pgid)
					r.Launch.Processes = fromLaunch(found)
				}
			})
		default:
			return nil // unknown: not proven gone
		}
	}
	// The instance's LMCache server ends with it (a restart_only park,
	// which keeps it, stops the engine alone: parkKeepingLMCache).
	resp, err := drv.Stop(ctx, &sdk.StopRequest{InstanceID: in.id, Grace: in.m.cfg.StopGrace, Launch: launch,
		LMCacheServer: toLaunch(rec.LMCache)})
	if err != nil {
		in.m.logger.Warn("stop after a failed launch failed", "instance", in.id, "error", err)
		return nil
	}
	return resp
}

// launchedIdentities asks the driver what a launch recorded without
// identities left running: gone when nothing of it runs (or the driver
// cannot recover launches, so nothing can be proven either way), else the
// launch with the identities its shim recorded; neither when the driver
// could not say.
func (in *instance) launchedIdentities(ctx context.Context, drv sdk.Driver, launch *sdk.Launch) (found *sdk.Launch, gone bool) {
	resp, err := drv.Recover(ctx, &sdk.RecoverRequest{InstanceID: in.id, Launch: *launch,
		Context: sdk.LaunchContext{InstanceID: in.id, LaunchID: launch.LaunchID, LaunchDir: launch.LaunchDir, Port: launch.Port}})
	switch {
	case errors.Is(err, sdk.ErrNotSupported):
		in.m.logger.Warn("the driver cannot recover a launch without identities; taken for gone", "instance", in.id)
		return nil, true
	case err != nil:
		in.m.logger.Warn("could not learn what a launch without identities left", "instance", in.id, "error", err)
		return nil, false
	case resp.State == sdk.RecoverStateGone:
		return nil, true
	}
	if resp.Launch.Pgid != 0 {
		return &resp.Launch, false
	}
	return nil, false
}

// stop ends the engine and proves it gone.
func (in *instance) stop(why string) error {
	rec := in.snapshot()
	m := in.m
	switch {
	case rec.State == structs.StateStopped:
		return nil
	case rec.State == structs.StateFailed:
		// A failed start may have left its LMCache server: it ends too.
		if rec.LMCache != nil {
			if err := in.endKeptLMCache(); err != nil {
				return err
			}
		}
		return in.transition(structs.StateStopped, why, nil)
	case parkedWithLMCacheOnly(rec) || (rec.State == structs.StateStopping && rec.Released == releasedKeptLMCache):
		// The engine stopped at the park: only the server runs. It is
		// named alone; the engine's old process IDs are never signalled
		// again (they may belong to another process by now).
		if rec.State != structs.StateStopping {
			if err := in.transition(structs.StateStopping, why, nil); err != nil {
				return err
			}
		}
		if err := in.endKeptLMCache(); err != nil {
			return err
		}
		in.release(in.snapshot())
		return in.transition(structs.StateStopped, why, func(r *structs.InstanceRecord) {
			r.Endpoint = nil
			r.Phase = ""
			r.Released = "stopped"
			r.Launch = nil
		})
	}
	in.stopMonitor()
	if rec.Launch == nil {
		return in.transition(structs.StateStopped, why, nil)
	}
	if rec.State != structs.StateStopping {
		if err := in.transition(structs.StateStopping, why, nil); err != nil {
			return err
		}
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return err
	}
	resp := in.cleanupLaunch(drv, nil)
	if resp == nil || !resp.Gone {
		detail := "the engine's processes could not be proven gone"
		if resp != nil && resp.Detail != "" {
			detail = resp.Detail
		}
		e := structs.Errf(structs.CodeStillStopping, "instance %s: %s", in.id, detail)
		in.update(func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: m.cfg.Now().UTC()}
		})
		m.retryStop(in)
		return e
	}
	in.release(rec)
	return in.transition(structs.StateStopped, why, func(r *structs.InstanceRecord) {
		r.Endpoint = nil
		r.Phase = ""
		r.Released = "stopped"
	})
}

// endKeptLMCache ends the instance's LMCache server alone and proves it
// gone; still_stopping when it could not be (the record keeps it, so a
// later stop tries again).
func (in *instance) endKeptLMCache() error {
	rec := in.snapshot()
	drv, err := in.m.cfg.Drivers.Driver(in.m.ctx, rec.Driver)
	if err != nil {
		return err
	}
	if !in.endLMCache(drv) {
		e := structs.Errf(structs.CodeStillStopping, "instance %s: its LMCache server could not be proven gone", in.id)
		in.update(func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: in.m.cfg.Now().UTC()}
		})
		return e
	}
	return nil
}

// release gives back the memory and ports of a launch whose processes,
// and the instance's LMCache server, are proven gone.
func (in *instance) release(rec structs.InstanceRecord) {
	in.m.cfg.Requests.Stopped(in.id, rec.Generation)
	if in.m.cfg.Placer != nil {
		in.m.cfg.Placer.Release(in.id)
	}
	switch {
	case rec.LMCache != nil:
		in.forgetLMCache(rec.LMCache)
	case rec.Launch != nil && rec.Launch.LMCachePort != 0:
		// A launch recorded before the server belonged to the instance.
		in.m.cfg.Ports.Release(rec.Launch.LMCachePort)
	}
	if rec.Launch != nil && rec.Launch.Port != 0 {
		in.m.cfg.Ports.Release(rec.Launch.Port)
	}
}

// exited handles an engine that died while it should be running.
func (in *instance) exited(p *sdk.ProbeResponse) error {
	rec := in.snapshot()
	if rec.State != structs.StateReady && rec.State != structs.StateParked {
		return nil
	}
	m := in.m
	in.stopMonitor()
	msg := fmt.Sprintf("the engine exited with code %d", p.ExitCode)
	if lines := p.LastLogLines; len(lines) > 0 {
		msg += "; last log lines:\n  " + strings.Join(lines, "\n  ")
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err == nil {
		// Helpers the engine started may remain: end the whole group.
		if resp := in.cleanupLaunch(drv, nil); resp != nil && !resp.Gone {
			m.logger.Warn("processes of an exited engine remain", "instance", in.id)
			err := in.transition(structs.StateStopping, "engine exited; helpers remain", nil)
			m.retryStop(in)
			return err
		}
	}
	in.release(rec)
	m.event("engine_exited", in.dep, in.id, map[string]any{"exit_code": p.ExitCode})
	return in.transition(structs.StateStopped, "engine exited", func(r *structs.InstanceRecord) {
		r.Reason = structs.ReasonEngineExited
		r.LastError = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: msg, At: m.cfg.Now().UTC()}
		r.Endpoint = nil
		r.Phase = ""
		r.Released = "engine exited"
	})
}

// retryStop stops an instance left stopping (its processes not proven gone)
// again, after a cooldown that doubles each time (StopRetryCooldown, up to
// a minute), until a stop proves them gone or the instance is no longer
// stopping; one chain of retries per instance at a time. A role restart
// finishes such a stop too (recover).
func (m *Manager) retryStop(in *instance) {
	if !in.stopRetrying.CompareAndSwap(false, true) {
		return
	}
	m.goTracked(func() {
		defer in.stopRetrying.Store(false)
		cooldown := m.cfg.StopRetryCooldown
		for {
			select {
			case <-time.After(cooldown):
			case <-m.ctx.Done():
				return
			case <-in.quit:
				return
			}
			if in.state() != structs.StateStopping {
				return
			}
			err := in.do(m.ctx, cmdStop, "retry the stop: its processes were not proven gone")
			if err == nil || !structs.HasCode(err, structs.CodeStillStopping) {
				return
			}
			cooldown = min(2*cooldown, time.Minute)
		}
	})
}
