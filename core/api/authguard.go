// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"math"
	"net"
	"net/http"
	"sync"
	"time"
)

// Defaults of the failed-authentication guard.
const (
	// DefaultAuthFailuresPerMinute is how many failed authentications a
	// client address may make per minute, after a burst of as many: past
	// it, its requests are refused rate_limited before their key is even
	// looked at, until its allowance refills.
	DefaultAuthFailuresPerMinute = 30
	// authGuardMaxAddresses bounds the addresses the guard remembers; past
	// it, those whose allowance is full again are forgotten first, then
	// the oldest.
	authGuardMaxAddresses = 65536
)

// authGuard rate-limits failed authentications per client address (a
// token bucket per address: a burst of perMinute, refilled at perMinute a
// minute). A key cannot be guessed from one address faster than that, and
// a flood of wrong keys costs one map lookup each.
type authGuard struct {
	perMinute float64
	now       func() time.Time

	mu    sync.Mutex
	addrs map[string]*guardBucket
}

type guardBucket struct {
	tokens float64
	at     time.Time
}

// newAuthGuard returns a guard; perMinute <= 0 turns it off.
func newAuthGuard(perMinute int) *authGuard {
	if perMinute <= 0 {
		return nil
	}
	return &authGuard{perMinute: float64(perMinute), now: time.Now, addrs: map[string]*guardBucket{}}
}

// clientHost is the request's client address without its port.
func clientHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// refill brings a bucket to now.
func (g *authGuard) refill(b *guardBucket, now time.Time) {
	if dt := now.Sub(b.at); dt > 0 {
		b.tokens = math.Min(g.perMinute, b.tokens+dt.Minutes()*g.perMinute)
		b.at = now
	}
}

// blocked returns how long addr must wait before it may try again (0: it
// may now).
func (g *authGuard) blocked(addr string) time.Duration {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.addrs[addr]
	if b == nil {
		return 0
	}
	now := g.now()
	g.refill(b, now)
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) / g.perMinute * float64(time.Minute))
}

// failed counts a failed authentication from addr.
func (g *authGuard) failed(addr string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	b := g.addrs[addr]
	if b == nil {
		if len(g.addrs) >= authGuardMaxAddresses {
			g.evict(now)
		}
		b = &guardBucket{tokens: g.perMinute, at: now}
		g.addrs[addr] = b
	}
	g.refill(b, now)
	b.tokens = math.Max(b.tokens-1, 0)
}

// evict forgets the addresses whose allowance is full again, or, when
// none is, the one that failed longest ago.
func (g *authGuard) evict(now time.Time) {
	var oldest string
	var oldestAt time.Time
	for a, b := range g.addrs {
		g.refill(b, now)
		if b.tokens >= g.perMinute {
			delete(g.addrs, a)
			continue
		}
		if oldest == "" || b.at.Before(oldestAt) {
			oldest, oldestAt = a, b.at
		}
	}
	if len(g.addrs) >= authGuardMaxAddresses && oldest != "" {
		delete(g.addrs, oldest)
	}
}
