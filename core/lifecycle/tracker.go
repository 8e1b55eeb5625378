// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"sync"
	"time"
)

// requestView is what the lifecycle reads of the router's request counts
// before it drains, parks, switches or idles an instance; it never waits
// on the router's locks for long.
type requestView interface {
	// Active is the number of requests admitted to an instance that the
	// engine may still be working on: in flight, or cut and waiting to
	// settle on the engine's idle reading or the end of an abort.
	Active(instance string) int
	// SettleAtStop is the number of cut requests of an instance that settle
	// only when the engine stops: such an instance stops instead of parking.
	SettleAtStop(instance string) int
	// Waiting is the number of requests queued for a deployment.
	Waiting(deployment string) int
}

// noRequests is the view of a lifecycle without a router (tests).
type noRequests struct{}

func (noRequests) Active(string) int       { return 0 }
func (noRequests) SettleAtStop(string) int { return 0 }
func (noRequests) Waiting(string) int      { return 0 }

// trackerView reads a RequestTracker.
type trackerView struct{ t RequestTracker }

func (v trackerView) Active(i string) int       { return v.t.Requests(i).InFlight }
func (v trackerView) SettleAtStop(i string) int { return v.t.Requests(i).SettleAtStop }
func (v trackerView) Waiting(d string) int      { return v.t.Waiting(d) }

// requestsHolder lets the router be plugged in after the lifecycle exists.
type requestsHolder struct {
	mu sync.RWMutex
	t  RequestTracker
}

func (h *requestsHolder) get() requestView {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.t == nil {
		return noRequests{}
	}
	return trackerView{h.t}
}

// stopped tells the router that an instance's launch ended (every cut
// request it held is settled).
func (m *Manager) stopped(instance string, generation uint64) {
	if t := m.RequestTracker(); t != nil {
		t.InstanceStopped(instance, generation)
	}
}

// Touch records that a request used an instance (least-recently-used
// victims and idle timers read it). It is cheap: an atomic store.
func (m *Manager) Touch(instance string) {
	m.mu.Lock()
	in := m.byID[instance]
	m.mu.Unlock()
	if in != nil {
		in.lastUsed.Store(m.cfg.Now().UnixNano())
	}
}

// lastUsedAt returns when a request last used the instance.
func (in *instance) lastUsedAt() time.Time {
	n := in.lastUsed.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
