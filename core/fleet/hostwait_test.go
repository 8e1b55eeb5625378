// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestHostChanges_WaitEndsOnASignal: a wait on hosts ends at a change of
// one of its hosts or of a signal it was given, taken before the change;
// at its deadline (expired); or when its context ends.
func TestHostChanges_WaitEndsOnASignal(t *testing.T) {
	s := &Server{hosts: map[string]*liveHost{"gpu-a": {}, "gpu-b": {}}}
	var stop signal
	type result struct {
		expired bool
		err     error
	}
	wait := func(t *testing.T, c hostChanges, ctx context.Context, deadline <-chan time.Time) result {
		t.Helper()
		done := make(chan result, 1)
		go func() {
			expired, err := c.wait(ctx, deadline)
			done <- result{expired, err}
		}()
		select {
		case r := <-done:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("the wait did not end")
			return result{}
		}
	}
	cases := []struct {
		name   string
		fire   func()
		want   result
		ctxEnd bool
		late   bool
	}{
		{name: "a host's journal", fire: func() { s.hosts["gpu-b"].changed.publish() }},
		{name: "an operator's stop", fire: func() { stop.publish() }},
		{name: "the deadline", fire: func() {}, late: true, want: result{expired: true}},
		{name: "the context", fire: func() {}, ctxEnd: true, want: result{err: context.Canceled}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			changes := s.hostChanges([]string{"gpu-a", "gpu-b", "gpu-unknown"}, stop.changed())
			c.fire()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.ctxEnd {
				cancel()
			}
			var deadline chan time.Time
			if c.late {
				deadline = make(chan time.Time, 1)
				deadline <- time.Now()
			}
			if got := wait(t, changes, ctx, deadline); got != c.want {
				t.Fatalf("the wait ended with %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestSemaphore_ReleaseSignals: a look at a group deferred while an
// operation holds it waits on the group's freed signal, which the
// release fires; a signal taken after a release waits for the next one.
func TestSemaphore_ReleaseSignals(t *testing.T) {
	l := newSemaphore()
	if !l.tryAcquire() {
		t.Fatal("a free semaphore was not taken")
	}
	freed := l.freed.changed()
	if l.tryAcquire() {
		t.Fatal("a held semaphore was taken again")
	}
	l.release()
	select {
	case <-freed:
	default:
		t.Fatal("the release fired no signal")
	}
	next := l.freed.changed()
	select {
	case <-next:
		t.Fatal("a signal taken after the release fired without one")
	default:
	}
	if !l.tryAcquire() {
		t.Fatal("a released semaphore was not taken")
	}
	l.release()
}

// TestSemaphore_AWaitGivesUpWithItsContext: a group operation waiting for
// another's semaphore gives up when its context ends (its request's
// client went away, its deadline passed), with the context's error and
// without taking the semaphore; a waiter whose context lives takes it
// once it is released. No spinning: the wait is a channel send.
func TestSemaphore_AWaitGivesUpWithItsContext(t *testing.T) {
	l := newSemaphore()
	if err := l.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- l.acquire(ctx) }()
	waitQueued(t, 1) // a context that ended before the wait began proves nothing
	cancel()
	select {
	case err := <-gaveUp:
		if err != context.Canceled {
			t.Fatalf("a wait whose context ended: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a wait whose context ended is still waiting")
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if err := l.acquire(dctx); err != context.DeadlineExceeded {
		t.Fatalf("a wait past its deadline: %v, want context.DeadlineExceeded", err)
	}

	took := make(chan error, 1)
	go func() { took <- l.acquire(context.Background()) }()
	waitQueued(t, 1)
	l.release()
	select {
	case err := <-took:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter did not take the released semaphore (a waiter that gave up took it)")
	}
	if l.tryAcquire() {
		t.Fatal("the semaphore was free while the last waiter held it")
	}
	l.release()
}

// waitQueued waits until n goroutines are parked in semaphore.acquire's
// wait (the runtime's stacks say so), without sleeping for a guessed
// time.
func waitQueued(t *testing.T, n int) {
	t.Helper()
	poll.Until(t, 30*time.Second, fmt.Sprintf("%d waiter(s) queued on the semaphore", n), func() bool {
		buf := make([]byte, 1<<20)
		for {
			m := runtime.Stack(buf, true)
			if m < len(buf) {
				buf = buf[:m]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		queued := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			head, _, _ := strings.Cut(g, "\n")
			parked := strings.Contains(head, "[select") || strings.Contains(head, "[chan send")
			if parked && strings.Contains(g, "fleet.(*semaphore).acquire(") {
				queued++
			}
		}
		return queued == n
	})
}
