// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// TestRequestWriter_AFailedFoldKeepsTheJournal: records on disk in the
// journal are not lost to a fold whose commit failed (a transient store
// error, a full disk for the store's pages while the journal still takes
// its small appends): they stay in the journal, listed, and the next fold
// stores them; a role stopped while the store still fails leaves them to
// the next start. Past foldKeep×FoldMax records they are dropped and
// counted.
func TestRequestWriter_AFailedFoldKeepsTheJournal(t *testing.T) {
	s, path := newTestStore(t, Options{})
	var failing atomic.Bool
	opts := DefaultRequestWriterOptions()
	opts.Interval = time.Hour // only Flush and MaxBatch write
	opts.FoldInterval = time.Hour
	opts.MaxBatch = 4
	opts.commitErr = func() error {
		if failing.Load() {
			return errors.New("no space left on device")
		}
		return nil
	}
	w := NewRequestWriter(s, opts)
	failing.Store(true)
	for i := 0; i < 6; i++ {
		w.Record(request("a", i, time.Now()))
	}
	w.Flush() // written, its fold fails
	if got, _ := s.ListRequests("a", 100); len(got) != 6 || w.Dropped() != 0 {
		t.Fatalf("after a failed fold: %d listed, %d dropped; want 6, 0", len(got), w.Dropped())
	}
	if data, _ := os.ReadFile(JournalIn(path)); len(data) == 0 {
		t.Fatal("a failed fold emptied the journal")
	}
	failing.Store(false)
	w.Record(request("a", 6, time.Now()))
	w.Flush()
	if data, _ := os.ReadFile(JournalIn(path)); len(data) != 0 {
		t.Fatalf("the journal holds %d bytes after the fold that worked", len(data))
	}
	w.tailMu.RLock()
	tail := len(w.tail)
	w.tailMu.RUnlock()
	got, _ := s.ListRequests("a", 100)
	if len(got) != 7 || tail != 0 || w.Dropped() != 0 {
		t.Fatalf("after the next fold: %d listed (%d in the journal), %d dropped; want 7, 0, 0", len(got), tail, w.Dropped())
	}

	// Stopped while the store fails: the next start folds them.
	failing.Store(true)
	w.Record(request("b", 0, time.Now()))
	w.Record(request("b", 1, time.Now()))
	_ = w.Close()
	failing.Store(false)
	w2 := NewRequestWriter(s, opts)
	w2.Flush()
	if b, _ := s.ListRequests("b", 100); len(b) != 2 || w2.Dropped() != 0 {
		t.Fatalf("after a stop with a failing store: %d of deployment b listed, %d dropped; want 2, 0", len(b), w2.Dropped())
	}
	// A start whose fold fails keeps them too, and lists them.
	failing.Store(true)
	w2.Record(request("c", 0, time.Now()))
	_ = w2.Close()
	w3 := NewRequestWriter(s, opts)
	if c, _ := s.ListRequests("c", 100); len(c) != 1 || w3.Dropped() != 0 {
		t.Fatalf("a start whose fold fails: %d of deployment c listed, %d dropped; want 1, 0", len(c), w3.Dropped())
	}
	w3.Record(request("c", 1, time.Now()))
	w3.Flush()
	failing.Store(false)
	w3.Record(request("c", 2, time.Now()))
	w3.Flush()
	if c, _ := s.ListRequests("c", 100); len(c) != 3 || w3.Dropped() != 0 {
		t.Fatalf("after the store recovered: %d of deployment c listed (%v), %d dropped; want 3, 0", len(c), ids(c), w3.Dropped())
	}

	// Past the bound, a failing fold drops and counts.
	failing.Store(true)
	for i := 0; i < foldKeep*opts.FoldMax; i++ {
		w3.Record(request("d", i, time.Now()))
		if i%opts.Buffer == opts.Buffer-1 {
			w3.Flush()
		}
	}
	w3.Flush()
	if w3.Dropped() == 0 {
		t.Fatal("a fold failing past foldKeep×FoldMax records dropped none")
	}
	_ = w3.Close()
}

// TestRequestWriter_AFailedFoldIsNotRetriedByEveryWrite: once a fold
// failed and kept its records, the group writes that follow do not each
// try the store again (a transaction of thousands of records against a
// full disk every 50 ms); the fold timer, Flush and Close do, and a write
// does once foldKeep×FoldMax records wait, to drop them.
func TestRequestWriter_AFailedFoldIsNotRetriedByEveryWrite(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	var tries atomic.Int64
	opts := DefaultRequestWriterOptions()
	opts.Interval = time.Hour // only full batches are written
	opts.FoldInterval = time.Hour
	opts.MaxBatch = 4
	opts.FoldMax = 8
	opts.commitErr = func() error {
		tries.Add(1)
		return errors.New("no space left on device")
	}
	w := NewRequestWriter(s, opts)
	defer w.Close()
	// Flush (which folds too) is the sync point: every fold a write
	// started before it has been tried.
	record := func(from, n int) {
		for i := from; i < from+n; i++ {
			w.Record(request("a", i, time.Now()))
		}
		w.Flush()
	}
	record(0, 8) // FoldMax: tried by the write, then by Flush; kept
	if got := tries.Load(); got != 2 {
		t.Fatalf("%d folds tried (FoldMax, then Flush), want 2", got)
	}
	record(8, 16) // 24 waiting, under foldKeep×FoldMax: four writes, then Flush
	if got := tries.Load(); got != 3 {
		t.Fatalf("%d folds tried after four more writes and a Flush on a failing store, want 3 (only Flush's)", got)
	}
	record(24, 8) // 32 = foldKeep×FoldMax: the write tries, and drops
	if got, dropped := tries.Load(), w.Dropped(); got != 4 || dropped != 32 {
		t.Fatalf("at foldKeep×FoldMax: %d folds tried, %d dropped; want 4, 32", got, dropped)
	}
}
