// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// counter is a command body that counts its runs and answers ok, or the
// code given.
type counter struct {
	runs atomic.Int64
	code string
}

func (c *counter) fn() *hostv1.CommandResult {
	c.runs.Add(1)
	if c.code != "" {
		return &hostv1.CommandResult{Code: c.code, Message: "refused"}
	}
	return &hostv1.CommandResult{Ok: true}
}

func TestDeduper_Do(t *testing.T) {
	cases := []struct {
		name     string
		remember int
		code     string
		// ids are the deliveries, in order.
		ids []string
		// wantRuns is how often the body ran; wantReplayed is each
		// delivery's replayed flag.
		wantRuns     int64
		wantReplayed []bool
	}{
		{name: "one delivery runs", remember: 4, ids: []string{"c1"}, wantRuns: 1, wantReplayed: []bool{false}},
		{name: "a retry replays", remember: 4, ids: []string{"c1", "c1", "c1"}, wantRuns: 1, wantReplayed: []bool{false, true, true}},
		{name: "distinct ids each run", remember: 4, ids: []string{"c1", "c2", "c1", "c2"}, wantRuns: 2, wantReplayed: []bool{false, false, true, true}},
		{name: "a failure replays too", remember: 4, code: "capacity_blocked", ids: []string{"c1", "c1"}, wantRuns: 1, wantReplayed: []bool{false, true}},
		// remember 2: c1 is forgotten once c2 and c3 finished, and runs again.
		{name: "the oldest is forgotten", remember: 2, ids: []string{"c1", "c2", "c3", "c1", "c3"}, wantRuns: 4, wantReplayed: []bool{false, false, false, false, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewDeduper(c.remember)
			body := &counter{code: c.code}
			for i, id := range c.ids {
				res, err := d.Do(context.Background(), id, body.fn)
				if err != nil {
					t.Fatalf("delivery %d: %v", i, err)
				}
				if res.CommandId != id || res.Replayed != c.wantReplayed[i] {
					t.Errorf("delivery %d: got id %q replayed %v, want %q %v", i, res.CommandId, res.Replayed, id, c.wantReplayed[i])
				}
				if res.Ok != (c.code == "") || res.Code != c.code {
					t.Errorf("delivery %d: got ok %v code %q, want code %q", i, res.Ok, res.Code, c.code)
				}
			}
			if got := body.runs.Load(); got != c.wantRuns {
				t.Errorf("runs: got %d, want %d", got, c.wantRuns)
			}
			if d.Len() > c.remember {
				t.Errorf("holds %d results, remembers at most %d", d.Len(), c.remember)
			}
		})
	}
}

func TestDeduper_DoRefusesAnEmptyID(t *testing.T) {
	d := NewDeduper(0)
	_, err := d.Do(context.Background(), "", (&counter{}).fn)
	if structs.CodeOf(err) != structs.CodeInvalidRequest {
		t.Fatalf("got %v, want invalid_request", err)
	}
}

// TestDeduper_ConcurrentRetries delivers one command from several
// goroutines while the first delivery still runs: the body runs once and
// every delivery answers its result, exactly one of them not replayed.
func TestDeduper_ConcurrentRetries(t *testing.T) {
	const deliveries = 8
	d := NewDeduper(16)
	release := make(chan struct{})
	started := make(chan struct{})
	var runs atomic.Int64
	body := func() *hostv1.CommandResult {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		return &hostv1.CommandResult{Ok: true, Message: "engine started"}
	}
	results := make([]*hostv1.CommandResult, deliveries)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r, err := d.Do(context.Background(), "start-1", body)
		if err != nil {
			t.Error(err)
		}
		results[0] = r
	}()
	<-started
	for i := 1; i < deliveries; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.Do(context.Background(), "start-1", body)
			if err != nil {
				t.Error(err)
			}
			results[i] = r
		}()
	}
	poll.Until(t, 10*time.Second, "every retry to wait", func() bool { return d.waiters("start-1") == deliveries-1 })
	close(release)
	wg.Wait()

	if got := runs.Load(); got != 1 {
		t.Fatalf("the command ran %d times, want 1", got)
	}
	fresh := 0
	for i, r := range results {
		if r == nil || !r.Ok || r.Message != "engine started" || r.CommandId != "start-1" {
			t.Fatalf("delivery %d: got %v", i, r)
		}
		if !r.Replayed {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d deliveries were not replayed, want 1", fresh)
	}
}

// TestDeduper_WaitingRetryLeavesWithItsContext: a retry whose stream ends
// stops waiting; the first delivery still finishes and is remembered.
func TestDeduper_WaitingRetryLeavesWithItsContext(t *testing.T) {
	d := NewDeduper(4)
	release := make(chan struct{})
	started := make(chan struct{})
	first := make(chan *hostv1.CommandResult)
	go func() {
		r, _ := d.Do(context.Background(), "c1", func() *hostv1.CommandResult {
			close(started)
			<-release
			return &hostv1.CommandResult{Ok: true}
		})
		first <- r
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := d.Do(ctx, "c1", (&counter{}).fn)
		errc <- err
	}()
	poll.Until(t, 10*time.Second, "the retry to wait", func() bool { return d.waiters("c1") == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("retry: got %v, want context.Canceled", err)
	}
	close(release)
	if r := <-first; !r.Ok || r.Replayed {
		t.Fatalf("first delivery: got %v", r)
	}
	r, err := d.Do(context.Background(), "c1", (&counter{}).fn)
	if err != nil || !r.Replayed {
		t.Fatalf("a later retry: got %v, %v; want the remembered result", r, err)
	}
}

// TestDeduper_PanicAnswersRetries: a body that panics does not leave its
// retries waiting forever.
func TestDeduper_PanicAnswersRetries(t *testing.T) {
	d := NewDeduper(4)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not propagate")
			}
		}()
		d.Do(context.Background(), "c1", func() *hostv1.CommandResult { panic("boom") })
	}()
	r, err := d.Do(context.Background(), "c1", (&counter{}).fn)
	if err != nil || r.Code != string(structs.CodeInternal) || !r.Replayed {
		t.Fatalf("got %v, %v; want the internal failure replayed", r, err)
	}
}

// BenchmarkDeduper_Do measures a fresh command per iteration with the
// memory full, the steady state of a long-lived host.
func BenchmarkDeduper_Do(b *testing.B) {
	d := NewDeduper(DefaultRemember)
	body := (&counter{}).fn
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		d.Do(context.Background(), fmt.Sprintf("c%d", i), body)
	}
}
