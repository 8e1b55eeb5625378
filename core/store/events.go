// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// DefaultEventPage is the most events EventsAfter returns when its limit is
// not positive.
const DefaultEventPage = 1000

// AppendEvent adds an event to the journal, setting its Seq (one more than
// the last ever handed out, never reused) and At, and wakes the
// subscribers. Old events are pruned on the way (Options.EventMaxCount,
// EventMaxAge), a bounded batch per append.
func (s *Store) AppendEvent(e *structs.Event) (uint64, error) {
	var seq uint64
	err := s.Update(func(tx *Tx) error {
		var err error
		seq, err = tx.AppendEvent(e)
		return err
	})
	return seq, err
}

// EventsAfter returns up to limit events with Seq > seq, oldest first
// (limit <= 0: DefaultEventPage). A client whose cursor is below
// OldestEventSeq()-1 has missed events and must take a new snapshot.
func (s *Store) EventsAfter(seq uint64, limit int) ([]structs.Event, error) {
	return view(s, func(tx *Tx) ([]structs.Event, error) { return tx.EventsAfter(seq, limit) })
}

// OldestEventSeq returns the Seq of the oldest kept event, 0 when the
// journal is empty.
func (s *Store) OldestEventSeq() (uint64, error) {
	return view(s, func(tx *Tx) (uint64, error) { return tx.OldestEventSeq(), nil })
}

// LatestEventSeq returns the last Seq handed out, 0 before the first event.
// It does not go back when events are pruned.
func (s *Store) LatestEventSeq() (uint64, error) {
	return view(s, func(tx *Tx) (uint64, error) { return tx.LatestEventSeq(), nil })
}

// AppendEvent is Store.AppendEvent inside a transaction; the subscribers
// learn of the event when the transaction commits.
func (t *Tx) AppendEvent(e *structs.Event) (uint64, error) {
	if e == nil || e.Kind == "" {
		return 0, fmt.Errorf("append event: an event with a kind is required")
	}
	b := t.bucket(bucketEvents)
	seq, err := b.NextSequence()
	if err != nil {
		return 0, fmt.Errorf("append event: %w", err)
	}
	e.Seq = seq
	e.At = t.s.opts.Now().UTC()
	if err := putJSON(b, u64(seq), e); err != nil {
		return 0, fmt.Errorf("append event: %w", err)
	}
	t.lastEvent = seq
	if err := t.pruneEvents(); err != nil {
		return 0, err
	}
	return seq, nil
}

// EventsAfter is Store.EventsAfter inside a transaction.
func (t *Tx) EventsAfter(seq uint64, limit int) ([]structs.Event, error) {
	if limit <= 0 {
		limit = DefaultEventPage
	}
	out := []structs.Event{}
	c := t.bucket(bucketEvents).Cursor()
	for k, v := c.Seek(u64(seq + 1)); k != nil && len(out) < limit; k, v = c.Next() {
		var e structs.Event
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("decode event %d: %w", readU64(k), err)
		}
		out = append(out, e)
	}
	return out, nil
}

// OldestEventSeq is Store.OldestEventSeq inside a transaction.
func (t *Tx) OldestEventSeq() uint64 {
	k, _ := t.bucket(bucketEvents).Cursor().First()
	return readU64(k)
}

// LatestEventSeq is Store.LatestEventSeq inside a transaction.
func (t *Tx) LatestEventSeq() uint64 { return t.bucket(bucketEvents).Sequence() }

// pruneEvents drops the oldest events beyond the count or age bound, at
// most pruneBatch of them.
func (t *Tx) pruneEvents() error {
	b := t.bucket(bucketEvents)
	latest := b.Sequence()
	cutoff := t.s.opts.Now().Add(-t.s.opts.EventMaxAge)
	var doomed [][]byte
	c := b.Cursor()
	for k, v := c.First(); k != nil && len(doomed) < pruneBatch; k, v = c.Next() {
		// Keys are contiguous (only the oldest end is ever removed), so
		// this is the count kept once doomed is gone.
		count := latest - readU64(k) + 1
		if count <= uint64(t.s.opts.EventMaxCount) && !olderThan(v, cutoff) {
			break
		}
		doomed = append(doomed, append([]byte(nil), k...))
	}
	for _, k := range doomed {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
	}
	return nil
}

// olderThan reads a stored value's "at" (or "received_at") and compares it
// with cutoff; an undecodable value is old.
func olderThan(v []byte, cutoff time.Time) bool {
	var stamp struct {
		At         time.Time `json:"at"`
		ReceivedAt time.Time `json:"received_at"`
	}
	if err := json.Unmarshal(v, &stamp); err != nil {
		return true
	}
	at := stamp.At
	if at.IsZero() {
		at = stamp.ReceivedAt
	}
	return at.Before(cutoff)
}

// subscriber is one Subscribe call's channel.
type subscriber struct{ ch chan uint64 }

// Subscribe returns a channel that receives the latest Seq after events
// are appended, and a function that ends the subscription. Notifications
// never block the writer and coalesce: a slow reader finds only the latest
// Seq waiting, and reads EventsAfter from its own cursor. The channel is
// closed by cancel and by Close.
func (s *Store) Subscribe() (<-chan uint64, func()) {
	sub := &subscriber{ch: make(chan uint64, 1)}
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.closed {
		close(sub.ch)
		return sub.ch, func() {}
	}
	s.subs[sub] = struct{}{}
	return sub.ch, func() {
		s.subMu.Lock()
		defer s.subMu.Unlock()
		if _, ok := s.subs[sub]; ok {
			delete(s.subs, sub)
			close(sub.ch)
		}
	}
}

// notify hands seq to every subscriber, replacing a value not yet read.
func (s *Store) notify(seq uint64) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	// Commit handlers run after bbolt releases its lock, so two commits can
	// report out of order; hand out the highest Seq seen.
	if seq < s.notified {
		seq = s.notified
	}
	s.notified = seq
	for sub := range s.subs {
		select {
		case sub.ch <- seq:
			continue
		default:
		}
		select {
		case <-sub.ch:
		default:
		}
		select {
		case sub.ch <- seq:
		default:
		}
	}
}

// Cursor renders the resumable position after seq for the event stream's
// Last-Event-ID: "<incarnation>:<seq>".
func (s *Store) Cursor(seq uint64) string { return s.incarnation + ":" + strconv.FormatUint(seq, 10) }

// ResolveCursor returns the Seq a cursor of this store stands for. A cursor
// that does not parse is invalid_cursor; one from another incarnation of
// the file (a restored or recreated store), or older than the kept events,
// is cursor_expired with details.resnapshot_required: the client takes a
// new snapshot and follows from there.
func (s *Store) ResolveCursor(cursor string) (uint64, error) {
	inc, num, ok := strings.Cut(cursor, ":")
	seq, err := strconv.ParseUint(num, 10, 64)
	if !ok || inc == "" || err != nil {
		return 0, structs.Errf(structs.CodeInvalidCursor, "event cursor %q is not <incarnation>:<sequence>", cursor)
	}
	expired := func(why string) error {
		return structs.Errf(structs.CodeCursorExpired, "event cursor %q %s; take a new snapshot", cursor, why).
			WithDetail("resnapshot_required", true)
	}
	if inc != s.incarnation {
		return 0, expired("belongs to another store")
	}
	var oldest, latest uint64
	err = s.View(func(tx *Tx) error {
		oldest, latest = tx.OldestEventSeq(), tx.LatestEventSeq()
		return nil
	})
	if err != nil {
		return 0, err
	}
	if seq > latest {
		return 0, structs.Errf(structs.CodeInvalidCursor, "event cursor %q is ahead of the journal (%d)", cursor, latest)
	}
	// The events after seq must all still be kept: the next one is the
	// oldest kept or newer. With an empty journal, everything up to latest
	// was pruned.
	if (oldest > 0 && seq+1 < oldest) || (oldest == 0 && seq < latest) {
		return 0, expired("is older than the kept events")
	}
	return seq, nil
}
