// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"context"
	"slices"
	"sync"
)

// slots is the engine's scheduler: max requests run at once, the others
// wait in arrival order. A waiter that gives up leaves the queue at once.
// While paused (parked) no slot is handed out.
type slots struct {
	mu      sync.Mutex
	max     int
	running int
	paused  bool
	queue   []*waiter
}

// waiter is one queued request; ch is closed when it is granted a slot.
type waiter struct {
	ch      chan struct{}
	granted bool
}

func newSlots(max int) *slots { return &slots{max: max} }

// acquire takes a slot, waiting in line; it fails with ctx's cause when ctx
// ends first, and then holds no slot.
func (s *slots) acquire(ctx context.Context) error {
	s.mu.Lock()
	if !s.paused && s.running < s.max && len(s.queue) == 0 {
		s.running++
		s.mu.Unlock()
		return nil
	}
	w := &waiter{ch: make(chan struct{})}
	s.queue = append(s.queue, w)
	s.mu.Unlock()

	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		if w.granted { // granted as ctx ended: hand the slot on
			s.running--
			s.dispatch()
		} else {
			s.queue = slices.DeleteFunc(s.queue, func(q *waiter) bool { return q == w })
		}
		s.mu.Unlock()
		return context.Cause(ctx)
	}
}

// release gives a slot back and hands it to the first waiter.
func (s *slots) release() {
	s.mu.Lock()
	s.running--
	s.dispatch()
	s.mu.Unlock()
}

// dispatch grants free slots to waiters in order; s.mu is held.
func (s *slots) dispatch() {
	for !s.paused && s.running < s.max && len(s.queue) > 0 {
		w := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		w.granted = true
		s.running++
		close(w.ch)
	}
}

// setPaused stops or resumes handing out slots.
func (s *slots) setPaused(p bool) {
	s.mu.Lock()
	s.paused = p
	s.dispatch()
	s.mu.Unlock()
}

// counts returns the running and waiting requests.
func (s *slots) counts() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.queue)
}
