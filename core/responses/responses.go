// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package responses keeps the OpenAI Responses API's stored responses: one
// record per answer created with "store": true (the API's default), read
// back by GET /v1/responses/{id} and by a later request's
// previous_response_id, only by the API key that created it. Records live
// in the role's bbolt store (core/store, buckets responses and
// responses_by_time) for a retention (30 days by default) within a size
// bound (1 GiB by default), oldest first out.
//
// A Put never waits for the disk: the record is readable at once (Get and
// History look at the records not yet committed first) and a goroutine
// commits them in groups, as the request ledger's writer does. A crash can
// lose the records of the last Interval; a client that asked for one then
// gets response_not_found, never another record.
package responses

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Defaults of Options.
const (
	DefaultRetention = 30 * 24 * time.Hour
	DefaultMaxBytes  = 1 << 30
	DefaultInterval  = 50 * time.Millisecond
	// pruneEvery is how often an idle store looks for expired records.
	pruneEvery = 10 * time.Minute
	// pruneBudget bounds the records one commit removes.
	pruneBudget = 512
	// maxPendingBytes bounds the records waiting for their commit: past
	// it a Put commits on the caller's goroutine (back-pressure, never a
	// dropped response).
	maxPendingBytes = 64 << 20
	// MaxChain bounds the turns a previous_response_id walks back.
	MaxChain = 10_000
)

// Options configure a Store.
type Options struct {
	// Retention is how long a response is kept (default 30 days); a
	// negative one keeps nothing: Enabled is false.
	Retention time.Duration
	// MaxBytes bounds the records, all together (default 1 GiB); the
	// oldest go first.
	MaxBytes int64
	// Interval is the most a record waits for its group commit.
	Interval time.Duration
	// Node names the role that stores (its host or server name): the IDs
	// it hands out carry a tag of it, so that a fleet can tell which
	// server holds a response.
	Node   string
	Logger hclog.Logger
	Now    func() time.Time
}

// Store is the stored responses of one role.
type Store struct {
	st  *store.Store
	o   Options
	log hclog.Logger
	tag string

	// commitMu is held across a commit and a Delete, so that a Delete
	// never races a commit of the record it removes.
	commitMu sync.Mutex

	mu           sync.Mutex
	pending      map[string]*structs.StoredResponse
	pendingBytes int64
	closed       bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// Open starts a Store on st; Close it before st.
func Open(st *store.Store, o Options) *Store {
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	s := &Store{
		st: st, o: o, log: o.Logger.Named("responses"), tag: NodeTag(o.Node),
		pending: map[string]*structs.StoredResponse{},
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go s.run()
	return s
}

// Enabled reports whether responses are kept (a negative retention keeps
// none: a request's "store" then reads false).
func (s *Store) Enabled() bool { return s != nil && s.o.Retention > 0 }

// NodeTag is the 8 hex digits a node's name puts in the IDs it hands out.
func NodeTag(node string) string {
	h := sha256.Sum256([]byte(node))
	return hex.EncodeToString(h[:4])
}

// NewID returns the ID of a new response: "resp_", the node's tag and
// reqHex, the hex digits of the request's own ID (so the request log and
// the response name each other).
func (s *Store) NewID(reqHex string) string {
	tag := NodeTag("")
	if s != nil {
		tag = s.tag
	}
	return "resp_" + tag + reqHex
}

// TagOf returns the node tag an ID carries ("" for an ID this package did
// not hand out).
func TagOf(id string) string {
	rest, ok := strings.CutPrefix(id, "resp_")
	if !ok || len(rest) < 8 {
		return ""
	}
	if _, err := hex.DecodeString(rest[:8]); err != nil {
		return ""
	}
	return rest[:8]
}

// Tag is the store's own node tag.
func (s *Store) Tag() string { return s.tag }

// Put keeps a record. It never waits for the disk unless the records
// waiting for their commit are over their bound.
func (s *Store) Put(rec structs.StoredResponse) {
	if !s.Enabled() {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.commitNow([]*structs.StoredResponse{&rec})
		return
	}
	if old := s.pending[rec.ID]; old != nil {
		s.pendingBytes -= old.Size()
	}
	s.pending[rec.ID] = &rec
	s.pendingBytes += rec.Size()
	over := s.pendingBytes > maxPendingBytes
	s.mu.Unlock()
	if over {
		s.flush()
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Get returns owner's response id; response_not_found for another
// owner's, as for one that does not exist.
func (s *Store) Get(owner, id string) (*structs.StoredResponse, error) {
	if !s.Enabled() {
		return nil, notFound(id)
	}
	s.mu.Lock()
	r := s.pending[id]
	s.mu.Unlock()
	if r == nil {
		var err error
		r, err = s.st.GetResponse(id)
		if structs.HasCode(err, structs.CodeNotFound) {
			return nil, notFound(id)
		}
		if err != nil {
			return nil, err
		}
	}
	// IMPORTANT: another key's response reads as absent, never as
	// forbidden: an ID says nothing to a key that did not create it.
	if r.Owner != owner {
		return nil, notFound(id)
	}
	if s.expired(r) {
		return nil, notFound(id)
	}
	return r, nil
}

// Delete removes owner's response id.
func (s *Store) Delete(owner, id string) error {
	if _, err := s.Get(owner, id); err != nil {
		return err
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	if r := s.pending[id]; r != nil {
		s.pendingBytes -= r.Size()
		delete(s.pending, id)
	}
	s.mu.Unlock()
	_, err := s.st.DeleteResponse(id)
	return err
}

// History returns the conversation before the next turn of response id,
// oldest first: each stored turn's input items, then its output items.
// The instructions of earlier turns are not carried over (as OpenAI's
// API does).
func (s *Store) History(owner, id string) ([]json.RawMessage, error) {
	var chain []*structs.StoredResponse
	for cur := id; cur != ""; {
		if len(chain) >= MaxChain {
			return nil, structs.Errf(structs.CodeInvalidRequest, "previous_response_id %s continues more than %d responses", id, MaxChain)
		}
		r, err := s.Get(owner, cur)
		if err != nil {
			if cur != id && structs.HasCode(err, structs.CodeResponseNotFound) {
				return nil, structs.Errf(structs.CodeResponseNotFound, "previous_response_id %s continues response %s, which is not stored any more (deleted or past the retention)", id, cur)
			}
			return nil, err
		}
		chain = append(chain, r)
		cur = r.PreviousID
	}
	var items []json.RawMessage
	for i := len(chain) - 1; i >= 0; i-- {
		r := chain[i]
		var in []json.RawMessage
		if len(r.Input) > 0 {
			if err := json.Unmarshal(r.Input, &in); err != nil {
				return nil, structs.Wrap(structs.CodeInternal, err, "read the input of stored response %s", r.ID)
			}
		}
		items = append(items, in...)
		var out struct {
			Output []json.RawMessage `json:"output"`
		}
		if len(r.Response) > 0 {
			if err := json.Unmarshal(r.Response, &out); err != nil {
				return nil, structs.Wrap(structs.CodeInternal, err, "read the output of stored response %s", r.ID)
			}
		}
		items = append(items, out.Output...)
	}
	return items, nil
}

// Close commits what waits and stops the writer; later Puts commit at
// once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	return nil
}

// Flush commits every record put before the call.
func (s *Store) Flush() { s.flush() }

func (s *Store) expired(r *structs.StoredResponse) bool {
	return s.o.Now().Sub(r.CreatedAt) > s.o.Retention
}

func notFound(id string) error {
	return structs.Errf(structs.CodeResponseNotFound, "no stored response %q for this API key (stored with store false, deleted, past the retention, or another key's)", id)
}

func (s *Store) run() {
	defer close(s.done)
	s.prune()
	tick := time.NewTicker(pruneEvery)
	defer tick.Stop()
	var timer *time.Timer
	var timerC <-chan time.Time
	for {
		select {
		case <-s.kick:
			if timerC == nil {
				timer = time.NewTimer(s.o.Interval)
				timerC = timer.C
			}
		case <-timerC:
			timer, timerC = nil, nil
			s.flush()
		case <-tick.C:
			s.prune()
		case <-s.stop:
			if timer != nil {
				timer.Stop()
			}
			s.flush()
			return
		}
	}
}

// flush commits the records waiting, then removes them from the pending
// set (those not replaced meanwhile).
func (s *Store) flush() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	batch := make([]*structs.StoredResponse, 0, len(s.pending))
	for _, r := range s.pending {
		batch = append(batch, r)
	}
	s.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	if s.commitLocked(batch) != nil {
		return
	}
	s.mu.Lock()
	for _, r := range batch {
		if s.pending[r.ID] == r {
			delete(s.pending, r.ID)
			s.pendingBytes -= r.Size()
		}
	}
	s.mu.Unlock()
}

// commitNow commits records outside the writer (after Close).
func (s *Store) commitNow(batch []*structs.StoredResponse) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	_ = s.commitLocked(batch)
}

// commitLocked writes a batch and prunes; commitMu is held. A failed
// commit keeps the records pending (readable) and logs: the next one
// retries them.
func (s *Store) commitLocked(batch []*structs.StoredResponse) error {
	recs := make([]structs.StoredResponse, len(batch))
	for i, r := range batch {
		recs[i] = *r
	}
	err := s.st.Update(func(tx *store.Tx) error {
		if err := tx.PutResponses(recs); err != nil {
			return err
		}
		_, err := tx.PruneResponses(s.o.Now().Add(-s.o.Retention), s.o.MaxBytes, pruneBudget+len(recs))
		return err
	})
	if err != nil {
		s.log.Warn("storing responses failed; they stay in memory until the next commit", "records", len(recs), "error", err)
	}
	return err
}

// prune removes the expired and the oldest past the size bound.
func (s *Store) prune() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	for {
		var n int
		err := s.st.Update(func(tx *store.Tx) error {
			var err error
			n, err = tx.PruneResponses(s.o.Now().Add(-s.o.Retention), s.o.MaxBytes, pruneBudget)
			return err
		})
		if err != nil {
			s.log.Warn("pruning stored responses failed", "error", err)
			return
		}
		if n < pruneBudget {
			return
		}
	}
}
