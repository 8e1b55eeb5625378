// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"math/rand/v2"
	"sync"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk/proc"
)

// PortPool leases loopback ports to engine launches from a range. A port is
// leased only when nothing listens on it; a port held by a foreign process
// is skipped (and a recorded port found taken at start is port_conflict).
type PortPool struct {
	mu     sync.Mutex
	lo, hi int
	leased map[int]string
	next   int
	// free reports whether a port can be bound on 127.0.0.1.
	free func(port int) bool
}

// NewPortPool returns a pool over [lo, hi]. Leases go round the range from
// a random port: two roles started at once on the same range (two
// `capyctl dev`) would otherwise both lease its first port, both find it
// free, and the second launch would meet the first one's engine there.
func NewPortPool(lo, hi int) *PortPool {
	next := lo
	if hi > lo {
		next += rand.IntN(hi - lo + 1)
	}
	return &PortPool{lo: lo, hi: hi, leased: map[int]string{}, next: next, free: proc.PortFree}
}

// Lease returns a free port for owner.
func (p *PortPool) Lease(owner string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.hi - p.lo + 1
	for i := 0; i < n; i++ {
		port := p.next
		p.next++
		if p.next > p.hi {
			p.next = p.lo
		}
		if _, taken := p.leased[port]; taken {
			continue
		}
		if !p.free(port) {
			continue
		}
		p.leased[port] = owner
		return port, nil
	}
	return 0, structs.Errf(structs.CodePortConflict, "no free engine port in %d-%d", p.lo, p.hi)
}

// Claim records a port an existing launch holds (after a restart).
func (p *PortPool) Claim(port int, owner string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leased[port] = owner
}

// Release returns a port to the pool.
func (p *PortPool) Release(port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.leased, port)
}

// Leased returns the number of ports leased now.
func (p *PortPool) Leased() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.leased)
}
