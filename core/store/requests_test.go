// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
		// block holds the writer at its first write while the goroutines
		// record, so that nothing is written and the queue fills up.
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
			var w *RequestWriter
			if !c.block {
				w = NewRequestWriter(s, opts)
			}
			release := func() {}
			if c.block {
				// Hold the writer at its first write, so that nothing is
				// written and the queue fills up.
				held, done := make(chan struct{}), make(chan struct{})
				var once sync.Once
				opts.beforeWrite = func() {
					once.Do(func() { close(held) })
					<-done
				}
				release = func() { close(done) }
				w = NewRequestWriter(s, opts)
				w.Record(request("first", 0, time.Now()))
				<-held
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
			want := goroutines * each
			if c.block {
				want++ // the record that holds the writer
			}
			total := len(stored) + int(w.Dropped())
			if total != want {
				t.Errorf("stored %d + dropped %d = %d, want %d", len(stored), w.Dropped(), total, want)
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

// TestRequestWriter_GroupCommit pins the writer's group writes: the records
// queued before a Flush are written to the journal in one write, a group is
// written as soon as MaxBatch records wait, and the journal is folded into
// the store in one transaction. A writer that wrote or committed each record
// alone would pass every other test here.
func TestRequestWriter_GroupCommit(t *testing.T) {
	cases := []struct {
		name     string
		records  int
		maxBatch int
		writes   uint64
	}{
		{name: "one write for the queue", records: 100, maxBatch: 256, writes: 1},
		{name: "a write per full batch", records: 10, maxBatch: 4, writes: 3},
		{name: "exactly full batches", records: 8, maxBatch: 4, writes: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			s, _ := newTestStore(t, Options{Now: clock.Now})
			opts := DefaultRequestWriterOptions()
			opts.Interval = time.Hour // only Flush and MaxBatch write
			opts.FoldInterval = time.Hour
			opts.MaxBatch = c.maxBatch
			w := NewRequestWriter(s, opts)
			defer w.Close()
			before := s.commits.Load()
			for i := 0; i < c.records; i++ {
				w.Record(request("a", i, clock.Now()))
			}
			w.Flush()
			if got := w.writes.Load(); got != c.writes {
				t.Fatalf("%d records in %d writes, want %d", c.records, got, c.writes)
			}
			if got := s.commits.Load() - before; got != 1 {
				t.Fatalf("%d records folded in %d commits, want 1", c.records, got)
			}
			if got, _ := s.ListRequests("a", 1000); len(got) != c.records || w.Dropped() != 0 {
				t.Fatalf("%d records stored, %d dropped; want %d, 0", len(got), w.Dropped(), c.records)
			}
		})
	}
}

// waitFor polls cond until it holds (or fails the test after 30 s).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// copyFile copies src to dst (a missing src is an empty dst).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRequestWriter_WrittenRecordsSurviveACrash: what a crashed role left
// on disk (the store file and the journal as they were at the crash) gives
// the next role every record written to the journal, once each, whether
// the crash came before the journal was folded, after the fold committed
// but before the journal was emptied, or in the middle of a write (a torn
// last line). Records only queued are lost, as documented.
func TestRequestWriter_WrittenRecordsSurviveACrash(t *testing.T) {
	cases := []struct {
		name string
		// folded: the crash came after the fold's commit, before the
		// journal was emptied.
		folded bool
		torn   bool
	}{
		{name: "before the fold"},
		{name: "after the fold's commit", folded: true},
		{name: "torn last line", torn: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, path := newTestStore(t, Options{})
			opts := DefaultRequestWriterOptions()
			opts.Interval = time.Hour // only full batches are written
			opts.FoldInterval = time.Hour
			opts.MaxBatch = 4
			w := NewRequestWriter(s, opts)
			for i := 0; i < 10; i++ {
				w.Record(request("a", i, time.Now()))
			}
			w.Record(structs.RequestRecord{ID: "unrouted", Status: 404, ReceivedAt: time.Now()})
			w.Record(request("b", 0, time.Now()))
			// 12 records: three groups of 4 are written; nothing is folded.
			waitFor(t, "three writes", func() bool { return w.writes.Load() == 3 })
			if got := s.commits.Load(); got != 0 {
				t.Fatalf("%d commits before the fold, want 0", got)
			}
			if got, _ := s.ListRequests("", 100); len(got) != 12 {
				t.Fatalf("ListRequests lists %d written records before the fold, want 12", len(got))
			}
			crash := filepath.Join(t.TempDir(), "crash")
			if err := os.MkdirAll(crash, 0o700); err != nil {
				t.Fatal(err)
			}
			copyFile(t, JournalIn(path), JournalIn(PathIn(crash)))
			if c.folded {
				w.Flush()
			}
			copyFile(t, path, PathIn(crash))
			if c.torn {
				f, err := os.OpenFile(JournalIn(PathIn(crash)), os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = f.WriteString(`13 {"id":"torn","deploym`)
				_ = f.Close()
			}
			w.Record(request("a", 99, time.Now())) // queued after the crash's image
			_ = w.Close()

			s2, err := Open(PathIn(crash), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			w2 := NewRequestWriter(s2, opts)
			defer w2.Close()
			got, _ := s2.ListRequests("", 100)
			want := []string{"b-0", "unrouted", "a-9", "a-8", "a-7", "a-6", "a-5", "a-4", "a-3", "a-2", "a-1", "a-0"}
			if fmt.Sprint(ids(got)) != fmt.Sprint(want) {
				t.Fatalf("after the crash the ledger lists %v, want %v", ids(got), want)
			}
			if a, _ := s2.ListRequests("a", 100); len(a) != 10 {
				t.Errorf("deployment a lists %d records, want 10", len(a))
			}
			w2.Record(request("c", 0, time.Now()))
			w2.Flush()
			if got, _ := s2.ListRequests("", 2); fmt.Sprint(ids(got)) != "[c-0 b-0]" {
				t.Errorf("a record after the recovery: newest %v, want [c-0 b-0]", ids(got))
			}
			if data, _ := os.ReadFile(JournalIn(PathIn(crash))); len(data) != 0 {
				t.Errorf("the journal holds %d bytes after the fold", len(data))
			}
		})
	}
}

// appendJournal appends a journal line as RequestWriter.write writes it.
func appendJournal(buf []byte, seq uint64, raw []byte) []byte {
	buf = strconv.AppendUint(buf, seq, 10)
	buf = append(buf, ' ')
	buf = append(buf, raw...)
	return append(buf, '\n')
}

// TestRequestWriter_OffRemovesTheJournal: turning the ledger off removes
// the records a crashed role left in the journal, not only the store's.
func TestRequestWriter_OffRemovesTheJournal(t *testing.T) {
	s, path := newTestStore(t, Options{})
	if err := os.WriteFile(JournalIn(path), appendJournal(nil, 1, []byte(`{"id":"x","deployment":"a"}`)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := DefaultRequestWriterOptions()
	opts.MaxRecords = 0
	w := NewRequestWriter(s, opts)
	_ = w.Close()
	if _, err := os.Stat(JournalIn(path)); !os.IsNotExist(err) {
		t.Errorf("the journal is still there with the ledger off (stat: %v)", err)
	}
	if got, _ := s.ListRequests("", 10); len(got) != 0 {
		t.Errorf("an off ledger lists %v", ids(got))
	}
}
