// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func request(dep string, i int, at time.Time) structs.RequestRecord {
	return structs.RequestRecord{
		ID: fmt.Sprintf("%s-%d", dep, i), Deployment: dep, API: structs.APIChat,
		Outcome: "completed", Status: 200, ReceivedAt: at, TotalMs: 12.5, BytesIn: 100, BytesOut: 400,
	}
}

func ids(recs []structs.RequestRecord) []string {
	out := []string{}
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func TestRequestWriter_Record(t *testing.T) {
	clock := newFakeClock()
	s, _ := newTestStore(t, Options{Now: clock.Now})
	w := NewRequestWriter(s, DefaultRequestWriterOptions())
	for i := 0; i < 5; i++ {
		w.Record(request("a", i, clock.Now()))
		w.Record(request("b", i, clock.Now()))
	}
	w.Record(structs.RequestRecord{ID: "unrouted", Status: 404, ReceivedAt: clock.Now()})
	w.Flush()

	cases := []struct {
		name  string
		dep   string
		limit int
		want  []string
	}{
		{name: "one deployment newest first", dep: "a", limit: 3, want: []string{"a-4", "a-3", "a-2"}},
		{name: "other deployment", dep: "b", limit: 10, want: []string{"b-4", "b-3", "b-2", "b-1", "b-0"}},
		{name: "all", dep: "", limit: 3, want: []string{"unrouted", "b-4", "a-4"}},
		{name: "unknown deployment", dep: "z", limit: 3, want: []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := s.ListRequests(c.dep, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(ids(got)) != fmt.Sprint(c.want) {
				t.Errorf("ListRequests(%q, %d) = %v, want %v", c.dep, c.limit, ids(got), c.want)
			}
		})
	}
	got, _ := s.ListRequests("a", 1)
	if got[0].BytesOut != 400 || got[0].TotalMs != 12.5 {
		t.Errorf("record fields lost: %+v", got[0])
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Dropped() != 0 {
		t.Errorf("dropped %d", w.Dropped())
	}
	w.Record(request("a", 99, clock.Now()))
	if w.Dropped() != 1 {
		t.Errorf("a Record after Close: dropped = %d, want 1", w.Dropped())
	}
}

func TestRequestWriter_Concurrent(t *testing.T) {
	cases := []struct {
		name   string
		buffer int
		// block holds the store's writer lock while the goroutines record,
		// so that nothing is committed and the queue fills up.
		block bool
	}{
		{name: "large buffer loses nothing", buffer: 8 * 500},
		{name: "full buffer drops and counts", buffer: 64, block: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newTestStore(t, Options{})
			opts := DefaultRequestWriterOptions()
			opts.Buffer = c.buffer
			opts.MaxBatch = 32
			w := NewRequestWriter(s, opts)
			release := func() {}
			if c.block {
				held, done := make(chan struct{}), make(chan struct{})
				go func() {
					_ = s.Update(func(tx *Tx) error {
						close(held)
						<-done
						return nil
					})
				}()
				<-held
				release = func() { close(done) }
			}
			const goroutines, each = 8, 500
			var wg sync.WaitGroup
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := 0; i < each; i++ {
						w.Record(request(fmt.Sprintf("d%d", g), i, time.Now()))
					}
				}(g)
			}
			wg.Wait()
			release()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			stored, err := s.ListRequests("", goroutines*each+1)
			if err != nil {
				t.Fatal(err)
			}
			total := len(stored) + int(w.Dropped())
			if total != goroutines*each {
				t.Errorf("stored %d + dropped %d = %d, want %d", len(stored), w.Dropped(), total, goroutines*each)
			}
			if !c.block && w.Dropped() != 0 {
				t.Errorf("dropped %d with room in the buffer", w.Dropped())
			}
			if c.block && w.Dropped() == 0 {
				t.Error("nothing dropped with a full buffer and a blocked store")
			}
			for g := 0; g < goroutines && !c.block; g++ {
				got, _ := s.ListRequests(fmt.Sprintf("d%d", g), each+1)
				if len(got) != each {
					t.Errorf("deployment d%d: %d records, want %d", g, len(got), each)
				}
			}
		})
	}
}

func TestRequestWriter_Retention(t *testing.T) {
	cases := []struct {
		name       string
		maxRecords int
		maxAge     time.Duration
		// first batch, then the clock moves, then a second batch
		first, second int
		advance       time.Duration
		wantKept      int
		wantA         int
	}{
		{name: "count cap", maxRecords: 10, maxAge: time.Hour, first: 8, second: 8, wantKept: 10, wantA: 2},
		{name: "age cap", maxRecords: 1000, maxAge: time.Hour, first: 8, second: 3, advance: 2 * time.Hour, wantKept: 3, wantA: 0},
		{name: "young records stay", maxRecords: 1000, maxAge: time.Hour, first: 8, second: 3, advance: 30 * time.Minute, wantKept: 11, wantA: 8},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			s, _ := newTestStore(t, Options{Now: clock.Now})
			opts := DefaultRequestWriterOptions()
			opts.MaxRecords, opts.MaxAge = c.maxRecords, c.maxAge
			w := NewRequestWriter(s, opts)
			defer w.Close()
			for i := 0; i < c.first; i++ {
				w.Record(request("a", i, clock.Now()))
			}
			w.Flush()
			clock.Advance(c.advance)
			for i := 0; i < c.second; i++ {
				w.Record(request("b", i, clock.Now()))
			}
			w.Flush()
			all, _ := s.ListRequests("", 10_000)
			if len(all) != c.wantKept {
				t.Errorf("kept %d, want %d", len(all), c.wantKept)
			}
			a, _ := s.ListRequests("a", 10_000)
			if len(a) != c.wantA {
				t.Errorf("kept %d of deployment a, want %d", len(a), c.wantA)
			}
			if c.wantA == 0 {
				_ = s.View(func(tx *Tx) error {
					if tx.bucket(bucketRequestsByDeploy).Bucket([]byte("a")) != nil {
						t.Error("the index of a pruned deployment is left behind")
					}
					return nil
				})
			}
		})
	}
}

func TestRequestWriter_Off(t *testing.T) {
	cases := []struct {
		name string
		mut  func(o *RequestWriterOptions)
	}{
		{name: "max records 0", mut: func(o *RequestWriterOptions) { o.MaxRecords = 0 }},
		{name: "max age 0", mut: func(o *RequestWriterOptions) { o.MaxAge = 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newTestStore(t, Options{})
			on := NewRequestWriter(s, DefaultRequestWriterOptions())
			on.Record(request("a", 0, time.Now()))
			if err := on.Close(); err != nil {
				t.Fatal(err)
			}
			opts := DefaultRequestWriterOptions()
			c.mut(&opts)
			w := NewRequestWriter(s, opts)
			if w.Enabled() {
				t.Fatal("writer enabled")
			}
			w.Record(request("a", 1, time.Now()))
			w.Flush()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.ListRequests("", 10); len(got) != 0 {
				t.Errorf("an off ledger keeps %v", ids(got))
			}
			if w.Dropped() != 0 {
				t.Errorf("an off ledger counts drops: %d", w.Dropped())
			}
		})
	}
}

// TestRequestWriter_GroupCommit pins the writer's group commit: the records
// queued before a Flush are committed in one transaction, and a batch
// commits as soon as MaxBatch records wait. A writer that committed each
// record alone would pass every other test here.
func TestRequestWriter_GroupCommit(t *testing.T) {
	cases := []struct {
		name     string
		records  int
		maxBatch int
		commits  uint64
	}{
		{name: "one commit for the queue", records: 100, maxBatch: 256, commits: 1},
		{name: "a commit per full batch", records: 10, maxBatch: 4, commits: 3},
		{name: "exactly full batches", records: 8, maxBatch: 4, commits: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			s, _ := newTestStore(t, Options{Now: clock.Now})
			opts := DefaultRequestWriterOptions()
			opts.Interval = time.Hour // only Flush and MaxBatch commit
			opts.MaxBatch = c.maxBatch
			w := NewRequestWriter(s, opts)
			defer w.Close()
			before := s.commits.Load()
			for i := 0; i < c.records; i++ {
				w.Record(request("a", i, clock.Now()))
			}
			w.Flush()
			if got := s.commits.Load() - before; got != c.commits {
				t.Fatalf("%d records in %d commits, want %d", c.records, got, c.commits)
			}
			if got, _ := s.ListRequests("a", 1000); len(got) != c.records || w.Dropped() != 0 {
				t.Fatalf("%d records stored, %d dropped; want %d, 0", len(got), w.Dropped(), c.records)
			}
		})
	}
}
