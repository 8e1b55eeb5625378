// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"sync"
)

// undo is a stack of cleanups: each step that takes something (a slot in
// a host's count, a context, a hook, an answer's body, a connection)
// pushes what gives it back, and run gives everything back in the reverse
// order, once, on whatever path ends the work. A relayed stream taken
// over from net/http hands its stack to the goroutine that goes on with
// it (handOver).
type undo struct{ fns []func() }

// push adds a cleanup, run before those pushed earlier.
func (u *undo) push(f func()) { u.fns = append(u.fns, f) }

// run runs the cleanups, the last pushed first, and empties the stack.
func (u *undo) run() {
	for i := len(u.fns) - 1; i >= 0; i-- {
		u.fns[i]()
	}
	u.fns = nil
}

// handOver moves the cleanups to a new stack that the caller's run no
// longer runs.
func (u *undo) handOver() *undo {
	moved := &undo{fns: u.fns}
	u.fns = nil
	return moved
}

// openCount counts what is open (the streams the server took over from
// net/http) and lets a drain wait until none is, on a signal.
type openCount struct {
	mu    sync.Mutex
	n     int
	empty chan struct{} // closed when n falls to zero, for a waiter
}

// add counts one more open, or one fewer (-1).
func (c *openCount) add(d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += d
	if c.n == 0 && c.empty != nil {
		close(c.empty)
		c.empty = nil
	}
}

// wait waits until nothing is open; false when ctx ended first.
func (c *openCount) wait(ctx context.Context) bool {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return true
	}
	if c.empty == nil {
		c.empty = make(chan struct{})
	}
	ch := c.empty
	c.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}
