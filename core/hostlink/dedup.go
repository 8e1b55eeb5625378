// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// DefaultRemember is how many finished command results a Deduper keeps when
// NewDeduper is given 0. The server retries a command for as long as it
// waits for its result (a reconnect, a partition); a host receives a few
// commands a minute, so 4,096 results outlive any retry by hours at ~200
// bytes each (under 1 MiB).
const DefaultRemember = 4096

// Deduper runs each command once per command_id and answers every later
// delivery of the same ID with the first one's result. It keeps every
// command in flight and the last remember finished results, forgetting the
// oldest finished first.
//
// A retry that arrives while the first delivery still runs waits for it and
// gets its result; it never runs the command a second time. A retry that
// arrives after its ID was forgotten runs again: the instance generation
// every command carries lets the host's lifecycle refuse a stale one, and
// remember must be sized so that this does not happen within the server's
// retry window.
//
// A failed result is remembered like a successful one: the server decides
// again (with a new command_id) rather than retrying a refused command.
type Deduper struct {
	remember int

	mu      sync.Mutex
	entries map[string]*entry
	// finished is the finished IDs, oldest first; entries in flight are not
	// in it and are never forgotten.
	finished []string
}

type entry struct {
	done   chan struct{}
	result *hostv1.CommandResult
	// waiting counts the retries blocked on done; tests read it.
	waiting int
}

// NewDeduper returns a Deduper that remembers the last remember finished
// results (0: DefaultRemember).
func NewDeduper(remember int) *Deduper {
	if remember <= 0 {
		remember = DefaultRemember
	}
	return &Deduper{remember: remember, entries: map[string]*entry{}}
}

// Do runs fn for id unless id was seen: the first delivery runs fn and
// answers its result with command_id set to id; every other delivery waits
// for that result (or for ctx, when it returns ctx's error) and answers a
// copy of it marked replayed. fn runs on the first caller's goroutine and
// without the Deduper's lock; a panic in fn answers the waiting retries
// with an internal failure and propagates.
func (d *Deduper) Do(ctx context.Context, id string, fn func() *hostv1.CommandResult) (*hostv1.CommandResult, error) {
	if id == "" {
		return nil, structs.Errf(structs.CodeInvalidRequest, "command without a command_id")
	}
	d.mu.Lock()
	if e, ok := d.entries[id]; ok {
		e.waiting++
		d.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			d.mu.Lock()
			e.waiting--
			d.mu.Unlock()
			return nil, ctx.Err()
		}
		d.mu.Lock()
		e.waiting--
		d.mu.Unlock()
		r := proto.Clone(e.result).(*hostv1.CommandResult)
		r.Replayed = true
		return r, nil
	}
	e := &entry{done: make(chan struct{})}
	d.entries[id] = e
	d.mu.Unlock()

	var res *hostv1.CommandResult
	var panicked any
	func() {
		defer func() {
			if p := recover(); p != nil {
				panicked = p
				res = &hostv1.CommandResult{Code: string(structs.CodeInternal), Message: fmt.Sprintf("command panicked: %v", p)}
			}
		}()
		res = fn()
	}()
	if res == nil {
		res = &hostv1.CommandResult{Code: string(structs.CodeInternal), Message: "command answered no result"}
	}
	res.CommandId = id
	res.Replayed = false
	d.finish(id, e, res)
	if panicked != nil {
		panic(panicked)
	}
	return proto.Clone(res).(*hostv1.CommandResult), nil
}

// finish records e's result, wakes its retries and forgets the oldest
// finished results beyond remember.
func (d *Deduper) finish(id string, e *entry, res *hostv1.CommandResult) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e.result = res
	close(e.done)
	d.finished = append(d.finished, id)
	for len(d.finished) > d.remember {
		delete(d.entries, d.finished[0])
		d.finished[0] = ""
		d.finished = d.finished[1:]
	}
}

// Len returns how many command IDs the Deduper holds (in flight and
// finished).
func (d *Deduper) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.entries)
}

// waiters returns how many retries of id wait for its first delivery.
func (d *Deduper) waiters(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.entries[id]; ok {
		return e.waiting
	}
	return 0
}
