// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import "sync"

// signal tells waiters that something changed, in the shape of
// core/routes' Board: a waiter takes the channel, reads what it waits
// for, and waits on the channel; publish closes it. The zero signal is
// ready to use.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// changed returns a channel closed at the next publish.
func (g *signal) changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return g.ch
}

// publish wakes every waiter.
func (g *signal) publish() {
	g.mu.Lock()
	ch := g.ch
	g.ch = nil
	g.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}
