// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/go-hclog"
)

// Defaults of RequestWriterOptions.
const (
	DefaultRequestInterval   = 50 * time.Millisecond
	DefaultRequestBatch      = 256
	DefaultRequestBuffer     = 4096
	DefaultRequestMaxRecords = 100_000
	DefaultRequestMaxAge     = 7 * 24 * time.Hour
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
	// commit (default 50 ms).
	Interval time.Duration
	// MaxBatch commits as soon as this many records wait (default 256).
	MaxBatch int
	// Buffer is the queue's capacity (default 4096). A Record that finds
	// it full is dropped and counted, never waited for.
	Buffer int
	// MaxRecords bounds the number of stored records.
	MaxRecords int
	// MaxAge bounds their age, by ReceivedAt.
	MaxAge time.Duration
	// Logger reports failed commits; silent when nil.
	Logger hclog.Logger
}

// DefaultRequestWriterOptions returns the defaults: 50 ms or 256 records
// per commit, a 4096-record queue, 100 000 records kept for 7 days.
func DefaultRequestWriterOptions() RequestWriterOptions {
	return RequestWriterOptions{
		Interval:   DefaultRequestInterval,
		MaxBatch:   DefaultRequestBatch,
		Buffer:     DefaultRequestBuffer,
		MaxRecords: DefaultRequestMaxRecords,
		MaxAge:     DefaultRequestMaxAge,
	}
}

// RequestWriter is the request ledger's writer. Record never blocks: the
// router hands a record over and goes on; a goroutine group-commits the
// queue in one transaction per Interval (or per MaxBatch records).
//
// Durability, as documented for operators: a record is on disk at most
// Interval after its request ended; a crash or power loss can lose the
// records still queued (they describe requests to engines the same crash
// stopped). The state written beside them (deployments, instances, events)
// is committed synchronously and is never put at risk by the ledger.
type RequestWriter struct {
	s    *Store
	opts RequestWriterOptions
	log  hclog.Logger
	off  bool

	mu       sync.RWMutex // guards closed against Record's send
	closed   bool
	ch       chan structs.RequestRecord
	flushReq chan chan struct{}
	done     chan struct{}

	dropped atomic.Uint64
	lastErr atomic.Pointer[error]
}

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
	w := &RequestWriter{
		s:        s,
		opts:     opts,
		log:      opts.Logger,
		off:      opts.MaxRecords <= 0 || opts.MaxAge <= 0,
		ch:       make(chan structs.RequestRecord, opts.Buffer),
		flushReq: make(chan chan struct{}),
		done:     make(chan struct{}),
	}
	if w.log == nil {
		w.log = hclog.NewNullLogger()
	}
	if w.off {
		close(w.done)
		if err := s.Update(func(tx *Tx) error { return tx.purgeRequests() }); err != nil {
			w.log.Warn("could not remove the stored request ledger", "error", err)
			w.lastErr.Store(&err)
		}
		return w
	}
	go w.run()
	return w
}

// Enabled reports whether the ledger keeps records.
func (w *RequestWriter) Enabled() bool { return !w.off }

// Record queues r for the next group commit. It never blocks: when the
// queue is full, or the writer closed, r is dropped and counted.
func (w *RequestWriter) Record(r structs.RequestRecord) {
	if w.off {
		return
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		w.dropped.Add(1)
		return
	}
	select {
	case w.ch <- r:
	default:
		w.dropped.Add(1)
	}
}

// Dropped returns how many records were lost: the queue was full, the
// writer was closed, or their commit failed.
func (w *RequestWriter) Dropped() uint64 { return w.dropped.Load() }

// Err returns the last commit error, nil when every commit worked.
func (w *RequestWriter) Err() error {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Flush commits every record queued before the call and returns when it is
// on disk (or dropped).
func (w *RequestWriter) Flush() {
	reply := make(chan struct{})
	select {
	case w.flushReq <- reply:
		<-reply
	case <-w.done:
	}
}

// Close commits what is queued and stops the writer. Later Records are
// dropped. It returns the last commit error.
func (w *RequestWriter) Close() error {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		if !w.off {
			close(w.ch)
		}
	}
	w.mu.Unlock()
	<-w.done
	return w.Err()
}

func (w *RequestWriter) run() {
	defer close(w.done)
	batch := make([]structs.RequestRecord, 0, w.opts.MaxBatch)
	var timer *time.Timer
	var timerC <-chan time.Time
	flush := func() {
		if timer != nil {
			timer.Stop()
			timer, timerC = nil, nil
		}
		if len(batch) == 0 {
			return
		}
		if err := w.commit(batch); err != nil {
			w.dropped.Add(uint64(len(batch)))
			w.lastErr.Store(&err)
			w.log.Warn("request ledger commit failed; records dropped", "records", len(batch), "error", err)
		}
		batch = batch[:0]
	}
	for {
		select {
		case r, ok := <-w.ch:
			if !ok {
				flush()
				return
			}
			batch = append(batch, r)
			if len(batch) >= w.opts.MaxBatch {
				flush()
			} else if timerC == nil {
				timer = time.NewTimer(w.opts.Interval)
				timerC = timer.C
			}
		case <-timerC:
			timer, timerC = nil, nil
			flush()
		case reply := <-w.flushReq:
			for n := len(w.ch); n > 0; n-- {
				r, ok := <-w.ch
				if !ok {
					break
				}
				batch = append(batch, r)
				if len(batch) >= w.opts.MaxBatch {
					flush()
				}
			}
			flush()
			close(reply)
		}
	}
}

func (w *RequestWriter) commit(batch []structs.RequestRecord) error {
	return w.s.Update(func(tx *Tx) error {
		if err := tx.putRequests(batch); err != nil {
			return err
		}
		return tx.pruneRequests(w.opts.MaxRecords, w.opts.MaxAge, len(batch)+pruneBatch)
	})
}

// ListRequests returns up to limit records, newest first, of one
// deployment ("" for all; limit <= 0: DefaultRequestPage).
func (s *Store) ListRequests(deployment string, limit int) ([]structs.RequestRecord, error) {
	return view(s, func(tx *Tx) ([]structs.RequestRecord, error) { return tx.ListRequests(deployment, limit) })
}

// ListRequests is Store.ListRequests inside a transaction.
func (t *Tx) ListRequests(deployment string, limit int) ([]structs.RequestRecord, error) {
	if limit <= 0 {
		limit = DefaultRequestPage
	}
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

func (t *Tx) putRequests(batch []structs.RequestRecord) error {
	b, idx := t.bucket(bucketRequests), t.bucket(bucketRequestsByDeploy)
	for i := range batch {
		seq, err := b.NextSequence()
		if err != nil {
			return fmt.Errorf("put request records: %w", err)
		}
		if err := putJSON(b, u64(seq), &batch[i]); err != nil {
			return fmt.Errorf("put request records: %w", err)
		}
		if batch[i].Deployment == "" {
			continue
		}
		dep, err := idx.CreateBucketIfNotExists([]byte(batch[i].Deployment))
		if err != nil {
			return fmt.Errorf("put request records: %w", err)
		}
		if err := dep.Put(u64(seq), nil); err != nil {
			return fmt.Errorf("put request records: %w", err)
		}
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
		key        []byte
		deployment string
	}
	var gone []doomed
	c := b.Cursor()
	for k, v := c.First(); k != nil && len(gone) < budget; k, v = c.Next() {
		count := latest - readU64(k) + 1
		if count <= uint64(maxRecords) && !olderThan(v, cutoff) {
			break
		}
		var head struct {
			Deployment string `json:"deployment"`
		}
		_ = json.Unmarshal(v, &head)
		gone = append(gone, doomed{key: append([]byte(nil), k...), deployment: head.Deployment})
	}
	for _, d := range gone {
		if err := b.Delete(d.key); err != nil {
			return fmt.Errorf("prune request records: %w", err)
		}
		if d.deployment == "" {
			continue
		}
		dep := idx.Bucket([]byte(d.deployment))
		if dep == nil {
			continue
		}
		if err := dep.Delete(d.key); err != nil {
			return fmt.Errorf("prune request records: %w", err)
		}
		if k, _ := dep.Cursor().First(); k == nil {
			if err := deleteNested(idx, []byte(d.deployment)); err != nil {
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
