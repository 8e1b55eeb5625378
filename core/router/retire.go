// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capyctl/capyctl/core/routes"
)

// The router keeps state for what the route table names: pooled
// connections per engine address, and per deployment its admission places
// and line, metric series and latency rings. Engines come and go with
// every start (a fresh port, or a fresh socket in a fresh launch
// directory) and deployments with every delete, so what the table no
// longer names is retired here; a role that runs for weeks would otherwise
// keep an open file for every idle connection of every engine it ever
// stopped, and memory and metric series for every deployment it ever
// deleted.
//
//   - Engine connections: whenever a table is published, idle connections
//     to engines that are not among its ready targets are closed, and a
//     connection to such an engine is no longer pooled when its request
//     ends (engineClient.retain).
//   - Deployments: a deployment the table no longer has is forgotten once
//     it holds nothing (no request in flight, waiting, or cut and waiting
//     for evidence): its admission state, its metric series and its
//     latency rings go (settleOnce calls forgetDeleted).

// watchRoutes retains the engine connections of each table's ready
// targets, until the router closes.
func (rt *Router) watchRoutes() {
	defer rt.wg.Done()
	board := rt.cfg.Routes
	for {
		changed := board.Changed()
		rt.engine.retain(rt.liveAddrs(board.Load()))
		select {
		case <-changed:
		case <-rt.ctx.Done():
			return
		}
	}
}

// liveAddrs are the engine addresses of a table's ready targets (the pool's
// keys).
func (rt *Router) liveAddrs(tbl *routes.Table) map[string]bool {
	live := map[string]bool{}
	for _, r := range tbl.List() {
		for _, t := range r.Ready {
			if et, err := rt.targets.engineURL(t.Endpoint.BaseURL, ""); err == nil {
				live[et.addr] = true
			}
		}
	}
	return live
}

// retain closes the idle connections to addresses outside live, and makes
// finish close (not pool) a connection to one of them. A connection in use
// is never touched: its request ends first.
func (cl *engineClient) retain(live map[string]bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.live = live
	for addr := range cl.closers {
		if !live[addr] {
			delete(cl.closers, addr)
		}
	}
	for addr, list := range cl.idle {
		if live[addr] {
			continue
		}
		for _, c := range list {
			_ = c.Close()
		}
		delete(cl.idle, addr)
	}
}

// forgetDeleted forgets the deployments a table no longer has once they
// hold nothing.
func (rt *Router) forgetDeleted(tbl *routes.Table) {
	named := map[string]bool{}
	for _, r := range tbl.List() {
		named[r.Deployment] = true
	}
	for _, d := range rt.adm.Deployments() {
		name := d.Name()
		if named[name] || !rt.adm.Forget(name) {
			continue
		}
		rt.deps.Delete(name)
		rt.stats.forget(name)
	}
}

// forget drops a deployment's latency rings and metric series.
func (s *stats) forget(name string) {
	s.mu.Lock()
	delete(s.deps, name)
	s.mu.Unlock()
	for _, h := range []*prometheus.HistogramVec{s.queueWait, s.activation, s.ttfb, s.total} {
		h.DeleteLabelValues(name)
	}
	s.requests.DeletePartialMatch(prometheus.Labels{"deployment": name})
	s.refusals.DeletePartialMatch(prometheus.Labels{"deployment": name})
}
