// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"testing"
	"time"
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
