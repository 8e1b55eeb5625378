// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"sync"
	"time"
)

// Requests is the router's view of the requests of instances and
// deployments. The lifecycle asks it before draining, parking or choosing a
// victim; it never waits on the router's locks for long.
type Requests interface {
	// Active is the number of requests admitted to an instance that the
	// engine may still be working on: in flight, or cut and waiting to
	// settle on the engine's idle reading.
	Active(instance string) int
	// SettleAtStop is the number of cut requests of an instance that settle
	// only when the engine stops (cut before the engine answered anything):
	// such an instance stops instead of parking.
	SettleAtStop(instance string) int
	// Waiting is the number of requests queued for a deployment.
	Waiting(deployment string) int
}

// noRequests is the Requests of a lifecycle without a router (tests).
type noRequests struct{}

func (noRequests) Active(string) int       { return 0 }
func (noRequests) SettleAtStop(string) int { return 0 }
func (noRequests) Waiting(string) int      { return 0 }

// requestsHolder lets the router be plugged in after the lifecycle exists.
type requestsHolder struct {
	mu sync.RWMutex
	r  Requests
}

func (h *requestsHolder) get() Requests {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.r == nil {
		return noRequests{}
	}
	return h.r
}

// SetRequests plugs in the router's view of requests.
func (m *Manager) SetRequests(r Requests) {
	m.requests.mu.Lock()
	m.requests.r = r
	m.requests.mu.Unlock()
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
