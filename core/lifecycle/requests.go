// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"

	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// This file holds what the router asks of the lifecycle about requests, off
// the hot path: abort one request on its engine, read an engine's idle
// signal, learn whether an instance's launch has ended, and restart an
// instance whose places are all held by cut requests that settle only at
// its next stop (tracker.go has what the lifecycle reads of the requests).

// instanceByID finds an instance by its ID ("<deployment>/<index>").
func (m *Manager) instanceByID(id string) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.deployments {
		for _, in := range d.instances {
			if in.id == id {
				return in
			}
		}
	}
	return nil
}

// InstanceRun says where an instance's launch is: its generation (the
// count of its launches) and state. ok is false for an unknown instance.
func (m *Manager) InstanceRun(instanceID string) (generation uint64, state structs.InstanceState, ok bool) {
	in := m.instanceByID(instanceID)
	if in == nil {
		return 0, "", false
	}
	rec := in.snapshot()
	return rec.Generation, rec.State, true
}

// Abort asks an instance's driver to stop one request on the engine by the
// request ID the router sent. sent is true when the driver sent an abort
// (the engine ended the request); false when the engine stops requests on
// connection close only, or the instance is gone.
func (m *Manager) Abort(ctx context.Context, instanceID, requestID string) (sent bool, err error) {
	in := m.instanceByID(instanceID)
	if in == nil {
		return false, structs.Errf(structs.CodeNotFound, "no instance %s", instanceID)
	}
	rec := in.snapshot()
	if rec.Driver == "" {
		return false, structs.Errf(structs.CodeNotFound, "instance %s has no driver", instanceID)
	}
	drv, err := m.cfg.Drivers.Driver(ctx, rec.Driver)
	if err != nil {
		return false, err
	}
	resp, err := drv.Abort(ctx, &sdk.AbortRequest{InstanceID: instanceID, RequestID: requestID})
	if err != nil {
		return false, driverErr(err, "abort request")
	}
	return resp.Sent && resp.Mode == sdk.AbortModeRequestID, nil
}

// Load reads an instance's idle signal through its driver.
func (m *Manager) Load(ctx context.Context, instanceID string) (routes.InstanceLoad, error) {
	in := m.instanceByID(instanceID)
	if in == nil {
		return routes.InstanceLoad{}, structs.Errf(structs.CodeNotFound, "no instance %s", instanceID)
	}
	rec := in.snapshot()
	if rec.Driver == "" || rec.State != structs.StateReady {
		return routes.InstanceLoad{}, nil
	}
	drv, err := m.cfg.Drivers.Driver(ctx, rec.Driver)
	if err != nil {
		return routes.InstanceLoad{}, err
	}
	resp, err := drv.Load(ctx, &sdk.LoadRequest{InstanceID: instanceID})
	if err != nil {
		return routes.InstanceLoad{}, driverErr(err, "read engine load")
	}
	return routes.InstanceLoad{
		Known: resp.Known, Running: resp.Running, Waiting: resp.Waiting,
		KVUsage: resp.KVUsage, Figures: resp.Figures, At: m.cfg.Now(),
	}, nil
}

// RestartForSettlement stops an instance and starts it again, so that the
// cut requests that settle only at its next stop are settled and its places
// serve again. It returns at once; the restart runs in the instance's lane.
func (m *Manager) RestartForSettlement(instanceID string) {
	in := m.instanceByID(instanceID)
	if in == nil {
		return
	}
	m.goTracked(func() {
		const why = "restart: cancelled requests waiting for the next stop hold every place"
		m.logger.Info("restarting an instance to settle cancelled requests", "instance", instanceID)
		if err := in.do(m.ctx, cmdStop, why); err != nil {
			m.logger.Warn("restart for settlement: stop failed", "instance", instanceID, "error", err)
			return
		}
		m.cfg.Requests.Stopped(instanceID, in.snapshot().Generation)
		if err := in.do(m.ctx, cmdStart, why); err != nil {
			m.logger.Warn("restart for settlement: start failed", "instance", instanceID, "error", err)
		}
	})
}
