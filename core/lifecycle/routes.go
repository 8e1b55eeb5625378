// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"sort"

	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
)

// Routes returns the current route table.
func (m *Manager) Routes() *routes.Table { return m.board.Load() }

// Board is where the route tables are published: the router reads the
// current one without a lock and waits on its change signal.
func (m *Manager) Board() *routes.Board { return &m.board }

// rebuildRoutes publishes a new table from the in-memory state.
//
// IMPORTANT: the snapshots and the publication happen under routesMu.
// Transitions of different instances rebuild from their own goroutines;
// without the lock a rebuild that read an instance before its change could
// publish after the rebuild that followed the change, and the router would
// keep a ready instance out of its table until the next transition.
func (m *Manager) rebuildRoutes() {
	m.routesMu.Lock()
	defer m.routesMu.Unlock()
	m.mu.Lock()
	deps := make([]*deployment, 0, len(m.deployments))
	for _, d := range m.deployments {
		deps = append(deps, d)
	}
	m.mu.Unlock()
	list := make([]*routes.Route, 0, len(deps))
	for _, d := range deps {
		m.mu.Lock()
		rec := d.rec
		insts := append([]*instance(nil), d.instances...)
		m.mu.Unlock()
		spec := rec.Spec
		r := &routes.Route{
			Deployment: rec.Name,
			API:        spec.API,
			Routes:     spec.Routes,
			Desired:    rec.Desired,
			Activation: spec.Lifecycle.Activation,
			Revision:   rec.Revision,
			Spec:       &spec,
			Instances:  len(insts),
		}
		for _, in := range insts {
			snap := in.snapshot()
			if snap.State == structs.StateReady && snap.Endpoint != nil {
				r.Ready = append(r.Ready, &routes.Target{Instance: snap.ID(), Generation: snap.Generation, Revision: snap.Revision, Endpoint: *snap.Endpoint, LastUsed: &in.lastUsed})
			}
		}
		list = append(list, r)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Deployment < list[j].Deployment })
	m.board.Publish(routes.NewTable(list...))
}

// Changed returns a channel closed at the next write of an instance's
// record (a transition, a last error, a charge): a host's link to its
// server sends what changed at once. A waiter takes the channel before it
// reads the records.
func (m *Manager) Changed() <-chan struct{} {
	m.recordsMu.Lock()
	defer m.recordsMu.Unlock()
	if m.records == nil {
		m.records = make(chan struct{})
	}
	return m.records
}

// recordsChanged wakes Changed's waiters.
func (m *Manager) recordsChanged() {
	m.recordsMu.Lock()
	ch := m.records
	m.records = nil
	m.recordsMu.Unlock()
	if ch != nil {
		close(ch)
	}
}
