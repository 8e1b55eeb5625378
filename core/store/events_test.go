// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func appendN(t *testing.T, s *Store, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := s.AppendEvent(&structs.Event{Kind: "test", Deployment: "a", Payload: map[string]any{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
}

func seqs(events []structs.Event) []uint64 {
	out := []uint64{}
	for _, e := range events {
		out = append(out, e.Seq)
	}
	return out
}

func TestStore_AppendEvent(t *testing.T) {
	clock := newFakeClock()
	s, path := newTestStore(t, Options{Now: clock.Now})
	cases := []struct {
		name    string
		event   *structs.Event
		wantSeq uint64
		wantErr bool
	}{
		{name: "first", event: &structs.Event{Kind: "deployment_created", Deployment: "a"}, wantSeq: 1},
		{name: "second", event: &structs.Event{Kind: "instance_ready", Deployment: "a", Instance: "a/0", Payload: map[string]any{"state": "ready"}}, wantSeq: 2},
		{name: "seq given by the caller is replaced", event: &structs.Event{Seq: 99, Kind: "x"}, wantSeq: 3},
		{name: "no kind", event: &structs.Event{}, wantErr: true},
		{name: "nil", event: nil, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq, err := s.AppendEvent(c.event)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if seq != c.wantSeq || c.event.Seq != c.wantSeq {
				t.Errorf("seq = %d (event %d), want %d", seq, c.event.Seq, c.wantSeq)
			}
			if !c.event.At.Equal(clock.Now()) {
				t.Errorf("At = %v, want the store clock %v", c.event.At, clock.Now())
			}
		})
	}
	// Sequence numbers survive a reopen and are never reused.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(path, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	seq, err := s2.AppendEvent(&structs.Event{Kind: "after_reopen"})
	if err != nil || seq != 4 {
		t.Errorf("seq after reopen = %d, %v; want 4", seq, err)
	}
	events, _ := s2.EventsAfter(0, 0)
	if len(events) != 4 || events[1].Payload["state"] != "ready" {
		t.Errorf("events after reopen = %+v", events)
	}
}

func TestStore_EventsAfter(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	appendN(t, s, 10)
	cases := []struct {
		name  string
		after uint64
		limit int
		want  []uint64
	}{
		{name: "from the start", after: 0, limit: 3, want: []uint64{1, 2, 3}},
		{name: "middle", after: 5, limit: 2, want: []uint64{6, 7}},
		{name: "tail shorter than limit", after: 8, limit: 5, want: []uint64{9, 10}},
		{name: "caught up", after: 10, limit: 5, want: []uint64{}},
		{name: "beyond", after: 50, limit: 5, want: []uint64{}},
		{name: "default limit", after: 0, limit: 0, want: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := s.EventsAfter(c.after, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			if g := seqs(got); len(g) != len(c.want) || (len(g) > 0 && (g[0] != c.want[0] || g[len(g)-1] != c.want[len(c.want)-1])) {
				t.Errorf("EventsAfter(%d, %d) = %v, want %v", c.after, c.limit, g, c.want)
			}
		})
	}
}

func TestStore_PruneEvents(t *testing.T) {
	cases := []struct {
		name       string
		opts       Options
		append     int
		advance    time.Duration
		thenAppend int
		wantOldest uint64
		wantLatest uint64
	}{
		{name: "under the cap", opts: Options{EventMaxCount: 10}, append: 10, wantOldest: 1, wantLatest: 10},
		{name: "count cap", opts: Options{EventMaxCount: 10}, append: 25, wantOldest: 16, wantLatest: 25},
		{name: "age cap", opts: Options{EventMaxAge: time.Hour}, append: 5, advance: 2 * time.Hour, thenAppend: 1, wantOldest: 6, wantLatest: 6},
		{name: "young events stay", opts: Options{EventMaxAge: time.Hour}, append: 5, advance: 30 * time.Minute, thenAppend: 1, wantOldest: 1, wantLatest: 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			c.opts.Now = clock.Now
			s, _ := newTestStore(t, c.opts)
			appendN(t, s, c.append)
			clock.Advance(c.advance)
			appendN(t, s, c.thenAppend)
			oldest, _ := s.OldestEventSeq()
			latest, _ := s.LatestEventSeq()
			if oldest != c.wantOldest || latest != c.wantLatest {
				t.Errorf("oldest, latest = %d, %d; want %d, %d", oldest, latest, c.wantOldest, c.wantLatest)
			}
			got, _ := s.EventsAfter(0, 0)
			if want := int(c.wantLatest - c.wantOldest + 1); len(got) != want {
				t.Errorf("%d events kept, want %d", len(got), want)
			}
		})
	}
}

func TestStore_PruneEvents_Bounded(t *testing.T) {
	clock := newFakeClock()
	s, _ := newTestStore(t, Options{Now: clock.Now, EventMaxAge: time.Hour})
	total := pruneBatch + 100
	err := s.Update(func(tx *Tx) error {
		for i := 0; i < total; i++ {
			if _, err := tx.AppendEvent(&structs.Event{Kind: "bulk"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	appendN(t, s, 1)
	// One append removes at most pruneBatch old events; the next one the rest.
	if oldest, _ := s.OldestEventSeq(); oldest != uint64(pruneBatch+1) {
		t.Errorf("oldest after one append = %d, want %d", oldest, pruneBatch+1)
	}
	appendN(t, s, 1)
	if oldest, _ := s.OldestEventSeq(); oldest != uint64(total+1) {
		t.Errorf("oldest after two appends = %d, want %d", oldest, total+1)
	}
}

func TestStore_Subscribe(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ch, cancel := s.Subscribe()
	ch2, cancel2 := s.Subscribe()
	defer cancel2()

	appendN(t, s, 1)
	if seq := <-ch; seq != 1 {
		t.Errorf("woken with %d, want 1", seq)
	}
	// Three appends while nobody reads coalesce into the latest seq.
	appendN(t, s, 3)
	if seq := <-ch; seq != 4 {
		t.Errorf("coalesced wake-up = %d, want 4", seq)
	}
	select {
	case seq := <-ch:
		t.Errorf("extra wake-up %d", seq)
	default:
	}
	if seq := <-ch2; seq != 4 {
		t.Errorf("second subscriber woken with %d, want 4", seq)
	}
	cancel()
	cancel() // idempotent
	if _, ok := <-ch; ok {
		t.Error("channel still open after cancel")
	}

	// A reader blocked on the channel wakes on an append from elsewhere.
	var wg sync.WaitGroup
	wg.Add(1)
	got := make(chan uint64, 1)
	go func() {
		defer wg.Done()
		got <- <-ch2
	}()
	appendN(t, s, 1)
	wg.Wait()
	if seq := <-got; seq != 5 {
		t.Errorf("blocked reader woken with %d, want 5", seq)
	}

	// Close ends every subscription.
	ch3, _ := s.Subscribe()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch3; ok {
		t.Error("channel still open after Close")
	}
	ch4, cancel4 := s.Subscribe()
	cancel4()
	if _, ok := <-ch4; ok {
		t.Error("Subscribe on a closed store gave an open channel")
	}
}

func TestStore_ResolveCursor(t *testing.T) {
	s, _ := newTestStore(t, Options{EventMaxCount: 5})
	if seq, err := s.ResolveCursor(s.Cursor(0)); err != nil || seq != 0 {
		t.Fatalf("cursor 0 of an empty journal = %d, %v", seq, err)
	}
	appendN(t, s, 10) // keeps 6..10
	cases := []struct {
		name   string
		cursor string
		want   uint64
		code   structs.Code
	}{
		{name: "latest", cursor: s.Cursor(10), want: 10},
		{name: "just before the oldest kept", cursor: s.Cursor(5), want: 5},
		{name: "pruned", cursor: s.Cursor(4), code: structs.CodeCursorExpired},
		{name: "from the start after pruning", cursor: s.Cursor(0), code: structs.CodeCursorExpired},
		{name: "ahead", cursor: s.Cursor(11), code: structs.CodeInvalidCursor},
		{name: "another store", cursor: "0123456789abcdef0123456789abcdef:7", code: structs.CodeCursorExpired},
		{name: "no separator", cursor: "7", code: structs.CodeInvalidCursor},
		{name: "not a number", cursor: s.Incarnation() + ":x", code: structs.CodeInvalidCursor},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seq, err := s.ResolveCursor(c.cursor)
			if c.code != "" {
				wantCode(t, err, c.code)
				if c.code == structs.CodeCursorExpired && structs.AsError(err).Details["resnapshot_required"] != true {
					t.Error("resnapshot_required missing")
				}
				return
			}
			if err != nil || seq != c.want {
				t.Errorf("ResolveCursor = %d, %v; want %d", seq, err, c.want)
			}
		})
	}
	if len(s.Cursor(1<<63)) > 46 {
		t.Errorf("cursor %q is longer than 46 bytes", s.Cursor(1<<63))
	}
}
