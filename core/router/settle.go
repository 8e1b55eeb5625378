// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"
	"math"
	"time"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/structs"
)

// settleLoop looks for the evidence cut requests wait for: an instance
// whose launch ended (stopped, restarted) settles everything it held; an
// engine whose idle reading shows no more requests than CapyCTL still
// serves on it settles the requests waiting for that reading.
func (rt *Router) settleLoop() {
	defer rt.wg.Done()
	t := time.NewTicker(rt.cfg.SettleInterval)
	defer t.Stop()
	noIdle := map[string]int{}
	for {
		select {
		case <-rt.ctx.Done():
			return
		case <-t.C:
		}
		rt.settleOnce(noIdle)
	}
}

// noIdleReadings is how many readings without an idle signal in a row
// make an instance's idle waits wait for its next stop instead.
const noIdleReadings = 3

func (rt *Router) settleOnce(noIdle map[string]int) {
	// Deployments deleted since, that hold nothing any more, are forgotten
	// (retire.go).
	defer rt.forgetDeleted(rt.cfg.Routes.Load())
	if rt.req == nil {
		return
	}
	for _, d := range rt.adm.Deployments() {
		for _, ic := range d.Counts().Instances {
			if ic.Unsettled() == 0 {
				continue
			}
			gen, state, ok := rt.req.InstanceRun(ic.ID)
			if !ok {
				d.Stopped(ic.ID, math.MaxUint64)
				continue
			}
			if gen > 0 {
				d.Stopped(ic.ID, gen-1)
			}
			if state == structs.StateStopped || state == structs.StateFailed {
				d.Stopped(ic.ID, gen)
				continue
			}
			if ic.SettleWhenIdle == 0 || state != structs.StateReady {
				continue
			}
			before, _ := d.Instance(ic.ID)
			started := time.Now()
			ctx, cancel := context.WithTimeout(rt.ctx, 3*time.Second)
			load, err := rt.req.Load(ctx, ic.ID)
			cancel()
			if err != nil {
				continue
			}
			if !load.Known {
				noIdle[ic.ID]++
				if noIdle[ic.ID] >= noIdleReadings {
					d.NoIdleSignal(ic.ID)
					delete(noIdle, ic.ID)
				}
				continue
			}
			delete(noIdle, ic.ID)
			after, _ := d.Instance(ic.ID)
			live := int64(min(before.Live, after.Live))
			if load.Running+load.Waiting <= live {
				if n := d.SettleIdle(ic.ID, started); n > 0 {
					rt.logger.Debug("settled cut requests on an idle reading", "instance", ic.ID, "requests", n)
				}
			}
		}
	}
}

// abort asks the engine to end a cut request by its ID and settles it when
// the engine did; otherwise it waits for the fallback evidence.
func (rt *Router) abort(pe *admission.Pending, instance, requestID string, fallback admission.Settle) {
	ctx, cancel := context.WithTimeout(rt.ctx, 10*time.Second)
	defer cancel()
	sent, err := rt.req.Abort(ctx, instance, requestID)
	if err == nil && sent {
		pe.Settle()
		return
	}
	if err != nil {
		rt.logger.Debug("abort by request ID failed", "instance", instance, "request_id", requestID, "error", err)
	}
	pe.Downgrade(fallback)
}

// onSaturated restarts an instance whose places are all held by cut
// requests that only its next stop settles.
func (rt *Router) onSaturated(dep, instance string) {
	rt.logger.Warn("cancelled requests waiting for the next stop hold every place: restarting the instance",
		"deployment", dep, "instance", instance)
	if rt.req != nil {
		rt.req.RestartForSettlement(instance)
	}
}
