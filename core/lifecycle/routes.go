// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"sort"

	"github.com/capyctl/capyctl/core/structs"
)

// RouteTable is an immutable snapshot of what the router may send where. The
// lifecycle publishes a new one after every transition; the router reads the
// current one without a lock.
type RouteTable struct {
	byRoute map[string]*Route
	list    []*Route
}

// Route is one deployment as the router sees it.
type Route struct {
	Deployment string
	API        string
	// Routes are the public model names.
	Routes     []string
	Desired    string
	Activation string
	Revision   uint64
	Spec       *structs.Deployment
	// Ready are the instances that accept requests now.
	Ready []*Target
	// Instances is the number of instances the deployment has.
	Instances int
}

// Target is a ready instance.
type Target struct {
	Instance   string
	Generation uint64
	Endpoint   structs.EngineEndpoint
}

// Lookup returns the deployment serving a public model name.
func (t *RouteTable) Lookup(model string) *Route { return t.byRoute[model] }

// List returns every route, sorted by deployment name.
func (t *RouteTable) List() []*Route { return t.list }

// Routes returns the current table.
func (m *Manager) Routes() *RouteTable { return m.routes.Load() }

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
	t := &RouteTable{byRoute: map[string]*Route{}}
	for _, d := range deps {
		m.mu.Lock()
		rec := d.rec
		insts := append([]*instance(nil), d.instances...)
		m.mu.Unlock()
		spec := rec.Spec
		r := &Route{
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
				r.Ready = append(r.Ready, &Target{Instance: snap.ID(), Generation: snap.Generation, Endpoint: *snap.Endpoint})
			}
		}
		for _, name := range spec.Routes {
			t.byRoute[name] = r
		}
		if len(spec.Routes) == 0 {
			t.byRoute[rec.Name] = r
		}
		t.list = append(t.list, r)
	}
	sort.Slice(t.list, func(i, j int) bool { return t.list[i].Deployment < t.list[j].Deployment })
	m.routes.Store(t)
}
