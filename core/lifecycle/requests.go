// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// This file holds what the router asks of the lifecycle about requests, off
// the hot path: abort one request on its engine, read an engine's idle
// signal, learn whether an instance's launch has ended, and restart an
// instance whose places are all held by cut requests that settle only at
// its next stop. It also defines what the lifecycle may ask the router
// (RequestTracker) before it drains, parks, switches or stops an instance.

// RequestTracker is what the router tells the lifecycle about an
// instance's requests. Switching and draining wait for InFlight to reach
// zero (requests being served, and cut requests the engine may still be
// working on that an idle reading or an abort will settle); they never wait
// for SettleAtStop, which only the instance's next stop settles: a model
// that would park with such requests stops instead.
type RequestTracker interface {
	// Requests returns the counts of one instance.
	Requests(instanceID string) InstanceRequests
	// InstanceStopped tells the router that the launch of an instance up to
	// generation has ended (stopped, restarted, exited): every cut request
	// it held is settled.
	InstanceStopped(instanceID string, generation uint64)
	// Waiting returns the number of requests queued for a deployment.
	Waiting(deployment string) int
}

// InstanceRequests are the router's counts for one instance.
type InstanceRequests struct {
	// InFlight requests are being served, or were cut and will settle on
	// the engine's idle reading or its end of an abort.
	InFlight int
	// SettleAtStop requests were cut before the engine answered anything;
	// only the instance's next stop or restart settles them.
	SettleAtStop int
}

// SetRequestTracker gives the lifecycle the router's request counts.
func (m *Manager) SetRequestTracker(t RequestTracker) {
	m.requests.mu.Lock()
	m.requests.t = t
	m.requests.mu.Unlock()
}

// RequestTracker returns the tracker set with SetRequestTracker, or nil.
func (m *Manager) RequestTracker() RequestTracker {
	m.requests.mu.RLock()
	defer m.requests.mu.RUnlock()
	return m.requests.t
}

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
	resp, err := drv.Abort(ctx, &pb.AbortRequest{InstanceId: instanceID, RequestId: requestID})
	if err != nil {
		return false, driverErr(err, "abort request")
	}
	return resp.GetSent() && resp.GetMode() == pb.AbortMode_ABORT_MODE_REQUEST_ID, nil
}

// InstanceLoad is an engine's idle signal and load figures.
type InstanceLoad struct {
	// Known is false when the engine has no idle signal or did not answer.
	Known   bool               `json:"known"`
	Running int64              `json:"running"`
	Waiting int64              `json:"waiting"`
	KVUsage float64            `json:"kv_usage"`
	Figures map[string]float64 `json:"figures,omitempty"`
	// At is when the reading was taken.
	At time.Time `json:"at"`
}

// Load reads an instance's idle signal through its driver.
func (m *Manager) Load(ctx context.Context, instanceID string) (InstanceLoad, error) {
	in := m.instanceByID(instanceID)
	if in == nil {
		return InstanceLoad{}, structs.Errf(structs.CodeNotFound, "no instance %s", instanceID)
	}
	rec := in.snapshot()
	if rec.Driver == "" || rec.State != structs.StateReady {
		return InstanceLoad{}, nil
	}
	drv, err := m.cfg.Drivers.Driver(ctx, rec.Driver)
	if err != nil {
		return InstanceLoad{}, err
	}
	resp, err := drv.Load(ctx, &pb.LoadRequest{InstanceId: instanceID})
	if err != nil {
		return InstanceLoad{}, driverErr(err, "read engine load")
	}
	return InstanceLoad{
		Known: resp.GetKnown(), Running: resp.GetRunning(), Waiting: resp.GetWaiting(),
		KVUsage: resp.GetKvUsage(), Figures: resp.GetFigures(), At: m.cfg.Now(),
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
		if t := m.RequestTracker(); t != nil {
			t.InstanceStopped(instanceID, in.snapshot().Generation)
		}
		if err := in.do(m.ctx, cmdStart, why); err != nil {
			m.logger.Warn("restart for settlement: start failed", "instance", instanceID, "error", err)
		}
	})
}

// NewRouteTable builds a route table from routes, for tests and
// benchmarks that run the router without a lifecycle.
func NewRouteTable(routes ...*Route) *RouteTable {
	t := &RouteTable{byRoute: map[string]*Route{}}
	for _, r := range routes {
		for _, name := range r.Routes {
			t.byRoute[name] = r
		}
		if len(r.Routes) == 0 {
			t.byRoute[r.Deployment] = r
		}
		t.list = append(t.list, r)
	}
	return t
}
