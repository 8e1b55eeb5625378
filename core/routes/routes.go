// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package routes is what the router may send where: immutable route tables
// the lifecycle publishes after every transition, and a board that holds the
// current one and signals each change. It is a leaf: the router reads it
// without linking the lifecycle, its drivers or gRPC.
package routes

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Table is an immutable snapshot of what the router may send where.
type Table struct {
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
	// Revision is the deployment revision the instance serves (a
	// request's cache_salt digest names it).
	Revision uint64
	Endpoint structs.EngineEndpoint
	// LastUsed is the instance's last use (Unix nanoseconds), shared with
	// its owner, which reads it for idle timers and switch victims; nil
	// records nothing.
	LastUsed *atomic.Int64
}

// Touch records that a request used the target now: one atomic store, no
// lock.
func (t *Target) Touch(now time.Time) {
	if t.LastUsed != nil {
		t.LastUsed.Store(now.UnixNano())
	}
}

// NewTable builds a table from routes, in the order given; a route is found
// by each of its public names, or by its deployment's name when it has
// none.
func NewTable(routes ...*Route) *Table {
	t := &Table{byRoute: make(map[string]*Route, len(routes))}
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

// Lookup returns the deployment serving a public model name.
func (t *Table) Lookup(model string) *Route { return t.byRoute[model] }

// List returns every route, in the table's order.
func (t *Table) List() []*Route { return t.list }

// Board holds the current table and tells waiters when it changes. The
// zero Board holds an empty table.
type Board struct {
	cur atomic.Pointer[Table]

	mu      sync.Mutex
	changed chan struct{}
}

var empty = NewTable()

// Load returns the current table, without a lock.
func (b *Board) Load() *Table {
	if t := b.cur.Load(); t != nil {
		return t
	}
	return empty
}

// Changed returns a channel closed at the next Publish. A waiter takes the
// channel before it reads the table, so that a change between the two is
// never missed.
func (b *Board) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// Publish makes t the current table and wakes every waiter.
func (b *Board) Publish(t *Table) {
	b.cur.Store(t)
	b.mu.Lock()
	ch := b.changed
	b.changed = nil
	b.mu.Unlock()
	if ch != nil {
		close(ch)
	}
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
