// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"sync"

	"github.com/capyctl/capyctl/core/structs"
)

// groupOps serialises the operations on each group and keeps the last
// failure the server recorded for it (status shows it).
type groupOps struct {
	mu      sync.Mutex
	locks   map[string]*semaphore
	lastErr map[string]*structs.ErrorRecord
	// down are the groups an operation of the server's took down since it
	// last saw them ready (a park, a stop, a failure): the request path
	// does not trust a journal that may predate it.
	down map[string]bool
	// stops counts the operators' stops of each group: a bring-up that
	// waits for its head gives way to one at once.
	stops map[string]int
	// stopped fires at each operator's stop of a group.
	stopped signal
	// seen are the member failures already acted on: "<deployment>\x00<host>"
	// → the failed record's since (host clock, ms).
	seen map[string]int64
	// placing are the group placements (ids) this server is making now:
	// a pending placement not among them was left by an earlier leader.
	placing map[string]bool
}

// setPlacing records that this server makes (or no longer makes) group
// placement id.
func (g *groupOps) setPlacing(id string, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.placing == nil {
		g.placing = map[string]bool{}
	}
	if on {
		g.placing[id] = true
	} else {
		delete(g.placing, id)
	}
}

func (g *groupOps) isPlacing(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.placing[id]
}

// firstSight records a member's failure and reports whether it is new.
func (g *groupOps) firstSight(dep, host string, since int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen == nil {
		g.seen = map[string]int64{}
	}
	k := dep + "\x00" + host
	if g.seen[k] == since {
		return false
	}
	g.seen[k] = since
	return true
}

// memberFailed reports whether a member's record says its engine failed or
// exited by itself, from the transition's typed reason: an engine that
// exits is recorded stopped with engine_exited, a start that gave up
// failed with start_failed; a start an operator's stop ended is neither.
func memberFailed(state, reason string) bool {
	switch structs.TransitionReason(reason) {
	case structs.ReasonEngineExited:
		return state == string(structs.StateStopped) || state == string(structs.StateFailed)
	case structs.ReasonStartFailed:
		return state == string(structs.StateFailed)
	}
	return false
}

// lock returns a group's operation semaphore: one operation on a group
// at a time, taken with a context (an operation that waits gives up when
// its context ends), never by spinning.
func (g *groupOps) lock(name string) *semaphore {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.locks == nil {
		g.locks = map[string]*semaphore{}
	}
	l := g.locks[name]
	if l == nil {
		l = newSemaphore()
		g.locks[name] = l
	}
	return l
}

// semaphore is a lock taken with a context.
type semaphore struct {
	ch    chan struct{}
	freed signal // published at each release
}

func newSemaphore() *semaphore { return &semaphore{ch: make(chan struct{}, 1)} }

// acquire takes the semaphore, or returns ctx's error once it ends.
func (l *semaphore) acquire(ctx context.Context) error {
	select {
	case l.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryAcquire takes the semaphore if it is free now.
func (l *semaphore) tryAcquire() bool {
	select {
	case l.ch <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *semaphore) release() {
	<-l.ch
	l.freed.publish()
}

func (g *groupOps) setErr(name string, e *structs.ErrorRecord) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lastErr == nil {
		g.lastErr = map[string]*structs.ErrorRecord{}
	}
	if e == nil {
		delete(g.lastErr, name)
		return
	}
	g.lastErr[name] = e
}

func (g *groupOps) stopAsked(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stops[name]
}

func (g *groupOps) askStop(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stops == nil {
		g.stops = map[string]int{}
	}
	g.stops[name]++
	g.stopped.publish()
}

func (g *groupOps) setDown(name string, down bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down == nil {
		g.down = map[string]bool{}
	}
	g.down[name] = down
}

func (g *groupOps) isDown(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.down[name]
}

func (g *groupOps) err(name string) *structs.ErrorRecord {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr[name]
}
