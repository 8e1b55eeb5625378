// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"
)

// Defaults of RequestWriterOptions.
const (
	DefaultRequestInterval   = 50 * time.Millisecond
	DefaultRequestBatch      = 256
	DefaultRequestBuffer     = 4096
	DefaultRequestMaxRecords = 100_000
	DefaultRequestMaxAge     = 7 * 24 * time.Hour
	// DefaultRequestFoldInterval is how long records stay in the journal
	// before they are folded into the store.
	DefaultRequestFoldInterval = 5 * time.Second
	// DefaultRequestFoldMax folds as soon as this many records wait in the
	// journal (it bounds the memory they hold: about 0.4 KiB each).
	DefaultRequestFoldMax = 4096
	// DefaultRequestPage is what ListRequests returns when its limit is
	// not positive.
	DefaultRequestPage = 100
)

// RequestWriterOptions tune a RequestWriter.
//
// IMPORTANT: MaxRecords and MaxAge are taken as given: 0 (or less) in
// either keeps nothing, which turns the ledger off (Record does nothing and
// the records already stored are removed when the writer is made). Start
// from DefaultRequestWriterOptions() to keep 100 000 records for 7 days.
type RequestWriterOptions struct {
	// Interval is the most a record waits in the queue before its group
	// is written to disk (default 50 ms).
	Interval time.Duration
	// MaxBatch writes as soon as this many records wait (default 256).
	MaxBatch int
	// Buffer is the queue's capacity (default 4096). A Record that finds
	// it full is dropped and counted, never waited for.
	Buffer int
	// FoldInterval is the most a written record waits in the journal
	// before it is folded into the store (default 5 s).
	FoldInterval time.Duration
	// FoldMax folds as soon as this many records wait in the journal
	// (default 4096).
	FoldMax int
	// MaxRecords bounds the number of stored records.
	MaxRecords int
	// MaxAge bounds their age, by ReceivedAt.
	MaxAge time.Duration
	// Logger reports failed writes; silent when nil.
	Logger hclog.Logger

	// beforeWrite, when set (tests), runs before each group is written.
	beforeWrite func()
	// commitErr, when set (tests), fails a commit to the store.
	commitErr func() error
}

// foldKeep bounds, in FoldMax, how many records a failing fold keeps in the
// journal to fold again: past it they are dropped, as a failed commit's
// always were.
const foldKeep = 4

// DefaultRequestWriterOptions returns the defaults: a write every 50 ms or
// 256 records, a fold into the store every 5 s or 4096 records, a
// 4096-record queue, 100 000 records kept for 7 days.
func DefaultRequestWriterOptions() RequestWriterOptions {
	return RequestWriterOptions{
		Interval:     DefaultRequestInterval,
		MaxBatch:     DefaultRequestBatch,
		Buffer:       DefaultRequestBuffer,
		FoldInterval: DefaultRequestFoldInterval,
		FoldMax:      DefaultRequestFoldMax,
		MaxRecords:   DefaultRequestMaxRecords,
		MaxAge:       DefaultRequestMaxAge,
	}
}

// RequestWriter is the request ledger's writer. Record never blocks: the
// router hands a record over and goes on; a goroutine writes the queue to
// the ledger's journal (JournalIn: one synchronous append, O_DSYNC) every
// Interval or MaxBatch records, and folds the journal into the store (one
// bbolt transaction, which costs two fdatasyncs and a page write per
// touched page) every FoldInterval or FoldMax records, at Flush and at
// Close. A writer made on a store whose journal holds records (the last
// role crashed) folds them first.
//
// Durability, as documented for operators: a record is on disk at most
// Interval after its request ended (plus the write itself); a crash or
// power loss can lose the records still queued (they describe requests to
// engines the same crash stopped), never one written to the journal (a
// failed fold keeps them there, up to foldKeep×FoldMax records).
// ListRequests reads the journal's records too. The state written beside
// them (deployments, instances, events) is committed synchronously and is
// never put at risk by the ledger.
type RequestWriter struct {
	s    *Store
	opts RequestWriterOptions
	log  hclog.Logger
	off  bool

	// mu guards closed and pending: Record appends to pending and wakes
	// the writer (kick) only for a group's first record, which arms the
	// Interval timer, and at each MaxBatch records; a channel send per
	// record woke an idle writer for every request (a futex wake, about
	// 6 µs of a processor at one request at a time).
	mu       sync.Mutex
	closed   bool
	pending  []structs.RequestRecord // at most Buffer
	kick     chan struct{}           // 1 slot: pending needs the writer
	stop     chan struct{}           // closed by Close
	flushReq chan chan struct{}
	done     chan struct{}

	// Owned by run (and NewRequestWriter before it starts).
	journal *os.File // nil: the journal could not be opened; write to the store
	jsize   int64
	seq     uint64 // the last key given to a record

	// tail is what the journal holds, oldest first, for ListRequests. Only
	// run changes it; it appends to it or replaces it.
	tailMu sync.RWMutex
	tail   []journaled

	dropped atomic.Uint64
	lastErr atomic.Pointer[error]
	// writes and folds count the journal's appends and the folds that
	// committed (tests pin the group writes with them).
	writes atomic.Uint64
	folds  atomic.Uint64
}

// journaled is one record written to the journal and not yet folded.
type journaled struct {
	seq        uint64
	deployment string
	raw        []byte // the record's JSON, as stored
}

// JournalIn returns the request ledger's journal beside a store file.
func JournalIn(storePath string) string {
	return filepath.Join(filepath.Dir(storePath), JournalFileName)
}

// JournalFileName is the request ledger journal's name in the state
// directory.
const JournalFileName = "requests.journal"

// NewRequestWriter starts a writer on s. With MaxRecords or MaxAge at 0 the
// ledger is off: it removes what is stored and records nothing. Close the
// writer before the store, or its last records are dropped.
func NewRequestWriter(s *Store, opts RequestWriterOptions) *RequestWriter {
	if opts.Interval <= 0 {
		opts.Interval = DefaultRequestInterval
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultRequestBatch
	}
	if opts.Buffer <= 0 {
		opts.Buffer = DefaultRequestBuffer
	}
	if opts.FoldInterval <= 0 {
		opts.FoldInterval = DefaultRequestFoldInterval
	}
	if opts.FoldMax <= 0 {
		opts.FoldMax = DefaultRequestFoldMax
	}
	w := &RequestWriter{
		s:        s,
		opts:     opts,
		log:      opts.Logger,
		off:      opts.MaxRecords <= 0 || opts.MaxAge <= 0,
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		flushReq: make(chan chan struct{}),
		done:     make(chan struct{}),
	}
	if w.log == nil {
		w.log = hclog.NewNullLogger()
	}
	path := JournalIn(s.Path())
	if w.off {
		s.requestTail.Store(nil)
		close(w.done)
		err := s.Update(func(tx *Tx) error { return tx.purgeRequests() })
		if err == nil {
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = fmt.Errorf("remove the request ledger journal: %w", rerr)
			}
		}
		if err != nil {
			w.log.Warn("could not remove the stored request ledger", "error", err)
			w.lastErr.Store(&err)
		}
		return w
	}
	w.recover(path)
	s.requestTail.Store(w)
	go w.run()
	return w
}

// recover opens the journal, folds what a crashed role left in it, and
// takes up the store's sequence. Without a journal (it cannot be opened)
// each group is committed to the store, as before the journal.
func (w *RequestWriter) recover(path string) {
	// O_DSYNC: each append returns once its bytes are on disk, one syscall
	// where a write and an fdatasync were two.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|journalSync, 0o600)
	if err != nil {
		w.log.Warn("request ledger journal unavailable; records go to the store directly", "error", err)
		w.lastErr.Store(&err)
	} else {
		data, rerr := io.ReadAll(f)
		left := parseJournal(data)
		if rerr != nil {
			w.log.Warn("could not read the request ledger journal", "error", rerr)
		}
		kept := false
		if len(left) > 0 {
			if err := w.commit(left); err != nil {
				// The records stay in the journal, listed, and are
				// folded again with the next fold.
				w.lastErr.Store(&err)
				w.log.Warn("could not fold the request ledger journal; its records stay in it", "records", len(left), "error", err)
				w.tail, w.jsize, kept = left, int64(len(data)), true
			} else {
				w.log.Info("request ledger journal folded", "records", len(left))
			}
		}
		if kept {
			// A torn last line is cut off: the next append starts a line.
			if end := bytes.LastIndexByte(data, '\n') + 1; end < len(data) {
				_ = f.Truncate(int64(end))
				w.jsize = int64(end)
			}
		} else if err := f.Truncate(0); err != nil {
			w.log.Warn("could not empty the request ledger journal", "error", err)
		}
		w.journal = f
	}
	_ = w.s.View(func(tx *Tx) error {
		w.seq = tx.bucket(bucketRequests).Sequence()
		return nil
	})
	if n := len(w.tail); n > 0 && w.tail[n-1].seq > w.seq {
		w.seq = w.tail[n-1].seq
	}
}

// Enabled reports whether the ledger keeps records.
func (w *RequestWriter) Enabled() bool { return !w.off }

// Record queues r for the next group write. It never blocks: when the
// queue is full, or the writer closed, r is dropped and counted.
func (w *RequestWriter) Record(r structs.RequestRecord) {
	if w.off {
		return
	}
	w.mu.Lock()
	if w.closed || len(w.pending) >= w.opts.Buffer {
		w.mu.Unlock()
		w.dropped.Add(1)
		return
	}
	w.pending = append(w.pending, r)
	n := len(w.pending)
	w.mu.Unlock()
	if n == 1 || n%w.opts.MaxBatch == 0 {
		select {
		case w.kick <- struct{}{}:
		default: // the writer has a kick waiting and reads pending then
		}
	}
}

// Dropped returns how many records were lost: the queue was full, the
// writer was closed, or their write failed.
func (w *RequestWriter) Dropped() uint64 { return w.dropped.Load() }

// Err returns the last write error, nil when every write worked.
func (w *RequestWriter) Err() error {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Flush writes every record queued before the call, folds the journal into
// the store, and returns when they are there (or dropped).
func (w *RequestWriter) Flush() {
	reply := make(chan struct{})
	select {
	case w.flushReq <- reply:
		<-reply
	case <-w.done:
	}
}

// Close writes what is queued, folds the journal into the store and stops
// the writer. Later Records are dropped. It returns the last write error.
func (w *RequestWriter) Close() error {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
	w.mu.Unlock()
	<-w.done
	return w.Err()
}

func (w *RequestWriter) run() {
	defer close(w.done)
	// batch: the records taken from pending, to write; spare: the array
	// pending is given next (batch's, once written), so that neither is
	// allocated again.
	var batch, spare []structs.RequestRecord
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	var foldTimer *time.Timer
	var foldC <-chan time.Time
	// kept: the last fold failed and kept its records; the next is tried
	// by the fold timer, Flush or Close, not by every group's write, until
	// foldKeep×FoldMax records wait.
	kept := false
	fold := func() {
		if foldTimer != nil {
			foldTimer.Stop()
			foldTimer, foldC = nil, nil
		}
		kept = !w.fold()
	}
	// take moves pending's records to batch: all of them, or (whole
	// false) only MaxBatch's multiples, the rest left waiting for the
	// timer.
	take := func(whole bool) {
		w.mu.Lock()
		n := len(w.pending)
		if !whole {
			n -= n % w.opts.MaxBatch
		}
		if n > 0 {
			// The records are not copied: batch is pending's array
			// (spare its next), only the rest is.
			batch = w.pending[:n]
			w.pending, spare = append(spare[:0], w.pending[n:]...), nil
		}
		left := len(w.pending)
		w.mu.Unlock()
		if left == 0 && armed {
			timer.Stop()
			armed = false
		} else if left > 0 && !armed {
			timer.Reset(w.opts.Interval)
			armed = true
		}
	}
	// write writes batch to disk, MaxBatch records a group.
	write := func() {
		for rest := batch; len(rest) > 0; {
			n := min(len(rest), w.opts.MaxBatch)
			w.write(rest[:n])
			rest = rest[n:]
			if n := w.tailLen(); n >= w.opts.FoldMax && (!kept || n >= foldKeep*w.opts.FoldMax) {
				fold()
			} else if n > 0 && foldC == nil {
				foldTimer = time.NewTimer(w.opts.FoldInterval)
				foldC = foldTimer.C
			}
		}
		if batch != nil {
			clear(batch) // its strings are not kept alive
			spare, batch = batch[:0], nil
		}
	}
	for {
		select {
		case <-w.stop:
			take(true)
			write()
			fold()
			if w.journal != nil {
				_ = w.journal.Close()
			}
			return
		case <-w.kick:
			// A group's first record (arm the timer) or MaxBatch of them.
			take(false)
			if len(batch) > 0 {
				write()
			}
		case <-timer.C:
			armed = false
			take(true)
			write()
		case <-foldC:
			foldTimer, foldC = nil, nil
			fold()
		case reply := <-w.flushReq:
			take(true)
			write()
			fold()
			close(reply)
		}
	}
}

// write puts a group of records on disk: appended to the journal and
// synced (O_DSYNC; without a journal, committed to the store). A group
// that could not be written is dropped and counted.
func (w *RequestWriter) write(batch []structs.RequestRecord) {
	if w.opts.beforeWrite != nil {
		w.opts.beforeWrite()
	}
	entries := make([]journaled, 0, len(batch))
	// IMPORTANT: a fresh buffer per group: the entries' raw JSON are its
	// slices, kept until the fold.
	buf := make([]byte, 0, len(batch)*512)
	for i := range batch {
		line := len(buf)
		buf = strconv.AppendUint(buf, w.seq+1, 10)
		buf = append(buf, ' ')
		start := len(buf)
		var err error
		if buf, err = appendRecord(buf, &batch[i]); err != nil {
			buf = buf[:line]
			w.dropped.Add(1)
			w.setErr(err)
			continue
		}
		raw := buf[start:len(buf):len(buf)]
		buf = append(buf, '\n')
		w.seq++
		entries = append(entries, journaled{seq: w.seq, deployment: batch[i].Deployment, raw: raw})
	}
	if len(entries) == 0 {
		return
	}
	if w.journal == nil {
		if err := w.commit(entries); err != nil {
			w.failed(len(entries), err)
		}
		return
	}
	if _, err := w.journal.Write(buf); err != nil {
		// A torn line would hide the lines after it from a recovery.
		_ = w.journal.Truncate(w.jsize)
		w.failed(len(entries), fmt.Errorf("write the request ledger journal: %w", err))
		return
	}
	w.jsize += int64(len(buf))
	w.writes.Add(1)
	w.tailMu.Lock()
	w.tail = append(w.tail, entries...)
	w.tailMu.Unlock()
}

// fold commits the journal's records to the store and empties the journal.
// Records whose fold failed stay in the journal, listed, and are folded
// again with the next fold (or by the next start); past foldKeep×FoldMax
// of them they are dropped and counted, as a failed commit's always were.
// It reports false when a failed fold kept its records.
func (w *RequestWriter) fold() bool {
	w.tailMu.RLock()
	entries := w.tail
	w.tailMu.RUnlock()
	if len(entries) == 0 {
		return true
	}
	if err := w.commit(entries); err != nil {
		if len(entries) < foldKeep*w.opts.FoldMax {
			w.lastErr.Store(&err)
			w.log.Warn("request ledger fold failed; its records stay in the journal", "records", len(entries), "error", err)
			return false
		}
		w.failed(len(entries), err)
	} else {
		w.folds.Add(1)
	}
	// IMPORTANT: empty the journal only after the commit: a crash between
	// the two folds its records again at the next start, and commit skips
	// those the store already holds (by key).
	if w.journal == nil {
		// unreachable: without a journal, groups go to the store at once
	} else if err := w.journal.Truncate(0); err != nil {
		w.log.Warn("could not empty the request ledger journal", "error", err)
	} else {
		w.jsize = 0
	}
	w.tailMu.Lock()
	w.tail = nil
	w.tailMu.Unlock()
	return true
}

// setErr keeps err as the last error. (Its own function: err's address
// taken in write's loop put every record's err on the heap.)
func (w *RequestWriter) setErr(err error) { w.lastErr.Store(&err) }

func (w *RequestWriter) failed(n int, err error) {
	w.dropped.Add(uint64(n))
	w.lastErr.Store(&err)
	w.log.Warn("request ledger write failed; records dropped", "records", n, "error", err)
}

func (w *RequestWriter) tailLen() int {
	w.tailMu.RLock()
	defer w.tailMu.RUnlock()
	return len(w.tail)
}

// tailSnapshot returns the records in the journal, oldest first.
func (w *RequestWriter) tailSnapshot() []journaled {
	w.tailMu.RLock()
	defer w.tailMu.RUnlock()
	return w.tail
}

func (w *RequestWriter) commit(entries []journaled) error {
	if w.opts.commitErr != nil {
		if err := w.opts.commitErr(); err != nil {
			return err
		}
	}
	return w.s.Update(func(tx *Tx) error {
		if err := tx.putJournaled(entries); err != nil {
			return err
		}
		return tx.pruneRequests(w.opts.MaxRecords, w.opts.MaxAge, len(entries)+pruneBatch)
	})
}

// ListRequests returns up to limit records, newest first, of one
// deployment ("" for all; limit <= 0: DefaultRequestPage): those in the
// request ledger's journal, then those folded into the store.
func (s *Store) ListRequests(deployment string, limit int) ([]structs.RequestRecord, error) {
	if limit <= 0 {
		limit = DefaultRequestPage
	}
	out := []structs.RequestRecord{}
	// floor: the store's keys from here up are in the tail read first (a
	// fold may commit them between the two reads).
	floor := uint64(math.MaxUint64)
	if w := s.requestTail.Load(); w != nil {
		tail := w.tailSnapshot()
		if len(tail) > 0 {
			floor = tail[0].seq
		}
		for i := len(tail) - 1; i >= 0 && len(out) < limit; i-- {
			if deployment != "" && tail[i].deployment != deployment {
				continue
			}
			var r structs.RequestRecord
			if err := json.Unmarshal(tail[i].raw, &r); err != nil {
				return nil, fmt.Errorf("decode request record %d: %w", tail[i].seq, err)
			}
			out = append(out, r)
		}
	}
	if len(out) >= limit {
		return out, nil
	}
	stored, err := view(s, func(tx *Tx) ([]structs.RequestRecord, error) {
		return tx.listRequests(deployment, limit-len(out), floor)
	})
	if err != nil {
		return nil, err
	}
	return append(out, stored...), nil
}

// ListRequests is Store.ListRequests inside a transaction, of the records
// folded into the store.
func (t *Tx) ListRequests(deployment string, limit int) ([]structs.RequestRecord, error) {
	if limit <= 0 {
		limit = DefaultRequestPage
	}
	return t.listRequests(deployment, limit, math.MaxUint64)
}

// listRequests lists up to limit records with keys below floor.
func (t *Tx) listRequests(deployment string, limit int, floor uint64) ([]structs.RequestRecord, error) {
	out := []structs.RequestRecord{}
	b := t.bucket(bucketRequests)
	decode := func(k, v []byte) error {
		var r structs.RequestRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("decode request record %d: %w", readU64(k), err)
		}
		out = append(out, r)
		return nil
	}
	if deployment == "" {
		c := b.Cursor()
		for k, v := c.Last(); k != nil && len(out) < limit; k, v = c.Prev() {
			if readU64(k) >= floor {
				continue
			}
			if err := decode(k, v); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	idx := t.bucket(bucketRequestsByDeploy).Bucket([]byte(deployment))
	if idx == nil {
		return out, nil
	}
	c := idx.Cursor()
	for k, _ := c.Last(); k != nil && len(out) < limit; k, _ = c.Prev() {
		if readU64(k) >= floor {
			continue
		}
		v := b.Get(k)
		if v == nil {
			continue
		}
		if err := decode(k, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// putJournaled stores records under their journal keys. A record the store
// already holds (its key is not above the bucket's sequence: a fold the
// last role committed without emptying its journal) is skipped, so a
// journal folded twice stores each record once.
func (t *Tx) putJournaled(entries []journaled) error {
	b, idx := t.bucket(bucketRequests), t.bucket(bucketRequestsByDeploy)
	// Keys only grow (deletes take the oldest): full pages, not bbolt's
	// half-full splits, mean fewer pages to write and to search (about
	// 15 % of a fold). Not stored: the file's format is the same.
	b.FillPercent = 1.0
	last := b.Sequence()
	top := last
	// One array for every key (bbolt keeps them until the commit), and
	// each deployment's index bucket looked up once.
	keys := make([]byte, 0, 8*len(entries))
	var deps map[string]*bolt.Bucket
	for _, e := range entries {
		if e.seq <= last {
			continue
		}
		keys = binary.BigEndian.AppendUint64(keys, e.seq)
		key := keys[len(keys)-8:]
		if err := b.Put(key, e.raw); err != nil {
			return fmt.Errorf("put request records: %w", err)
		}
		top = max(top, e.seq)
		if e.deployment == "" {
			continue
		}
		dep := deps[e.deployment]
		if dep == nil {
			var err error
			if dep, err = idx.CreateBucketIfNotExists([]byte(e.deployment)); err != nil {
				return fmt.Errorf("put request records: %w", err)
			}
			dep.FillPercent = 1.0
			if deps == nil {
				deps = map[string]*bolt.Bucket{}
			}
			deps[e.deployment] = dep
		}
		if err := dep.Put(key, nil); err != nil {
			return fmt.Errorf("put request records: %w", err)
		}
	}
	if err := b.SetSequence(top); err != nil {
		return fmt.Errorf("put request records: %w", err)
	}
	return nil
}

// pruneRequests removes, oldest first and at most budget of them, the
// records beyond maxRecords or older than maxAge.
func (t *Tx) pruneRequests(maxRecords int, maxAge time.Duration, budget int) error {
	b, idx := t.bucket(bucketRequests), t.bucket(bucketRequestsByDeploy)
	latest := b.Sequence()
	cutoff := t.s.opts.Now().Add(-maxAge)
	type doomed struct {
		seq        uint64
		deployment string
	}
	var gone []doomed
	c := b.Cursor()
	for k, v := c.First(); k != nil && len(gone) < budget; k, v = c.Next() {
		count := latest - readU64(k) + 1
		if count <= uint64(maxRecords) && !olderThan(v, cutoff) {
			break
		}
		gone = append(gone, doomed{seq: readU64(k), deployment: recordDeployment(v)})
	}
	if len(gone) == 0 {
		return nil
	}
	// Each touched deployment's index bucket is looked up once, and
	// checked for emptiness once, at the end.
	deps := map[string]*bolt.Bucket{}
	var key [8]byte
	for _, d := range gone {
		binary.BigEndian.PutUint64(key[:], d.seq)
		if err := b.Delete(key[:]); err != nil {
			return fmt.Errorf("prune request records: %w", err)
		}
		if d.deployment == "" {
			continue
		}
		dep, seen := deps[d.deployment]
		if !seen {
			dep = idx.Bucket([]byte(d.deployment))
			deps[d.deployment] = dep
		}
		if dep == nil {
			continue
		}
		if err := dep.Delete(key[:]); err != nil {
			return fmt.Errorf("prune request records: %w", err)
		}
	}
	for name, dep := range deps {
		if dep == nil {
			continue
		}
		if k, _ := dep.Cursor().First(); k == nil {
			if err := deleteNested(idx, []byte(name)); err != nil {
				return fmt.Errorf("prune request records: %w", err)
			}
		}
	}
	return nil
}

// purgeRequests removes every request record (the ledger is off).
func (t *Tx) purgeRequests() error {
	for _, name := range [][]byte{bucketRequests, bucketRequestsByDeploy} {
		seq := t.bucket(name).Sequence()
		if err := t.tx.DeleteBucket(name); err != nil {
			return fmt.Errorf("purge request ledger: %w", err)
		}
		b, err := t.tx.CreateBucket(name)
		if err != nil {
			return fmt.Errorf("purge request ledger: %w", err)
		}
		// Keep the sequence so that record keys never repeat.
		if err := b.SetSequence(seq); err != nil {
			return fmt.Errorf("purge request ledger: %w", err)
		}
	}
	return nil
}
