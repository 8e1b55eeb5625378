// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"fmt"
	"time"
)

// IdempotencyRecord is the receipt of a mutation carried out under an
// Idempotency-Key: an exact retry (same BodyHash) replays Status and
// Response; the same key with another body is a conflict (the API's call).
type IdempotencyRecord struct {
	BodyHash string    `json:"body_hash"`
	Status   int       `json:"status"`
	Response []byte    `json:"response"`
	At       time.Time `json:"at"`
}

// PutIdempotency stores a receipt under key (At defaults to now). Receipts
// older than Options.IdempotencyTTL (24 h) are pruned by later writes.
func (s *Store) PutIdempotency(key string, rec IdempotencyRecord) error {
	return s.Update(func(tx *Tx) error { return tx.PutIdempotency(key, rec) })
}

// GetIdempotency returns a receipt, or not_found (also once it expired).
func (s *Store) GetIdempotency(key string) (*IdempotencyRecord, error) {
	return view(s, func(tx *Tx) (*IdempotencyRecord, error) { return tx.GetIdempotency(key) })
}

// PutIdempotency is Store.PutIdempotency inside a transaction.
func (t *Tx) PutIdempotency(key string, rec IdempotencyRecord) error {
	if key == "" {
		return fmt.Errorf("put idempotency key: empty key")
	}
	if rec.At.IsZero() {
		rec.At = t.s.opts.Now().UTC()
	}
	b, byTime := t.bucket(bucketIdempotency), t.bucket(bucketIdempotencyTime)
	var old IdempotencyRecord
	if ok, _ := getJSON(b, []byte(key), &old); ok {
		if err := byTime.Delete(expiryKey(old.At, key)); err != nil {
			return fmt.Errorf("put idempotency key: %w", err)
		}
	}
	if err := putJSON(b, []byte(key), rec); err != nil {
		return fmt.Errorf("put idempotency key: %w", err)
	}
	if err := byTime.Put(expiryKey(rec.At, key), nil); err != nil {
		return fmt.Errorf("put idempotency key: %w", err)
	}
	return t.pruneIdempotency()
}

// GetIdempotency is Store.GetIdempotency inside a transaction.
func (t *Tx) GetIdempotency(key string) (*IdempotencyRecord, error) {
	var rec IdempotencyRecord
	ok, err := getJSON(t.bucket(bucketIdempotency), []byte(key), &rec)
	if err != nil {
		return nil, fmt.Errorf("get idempotency key: %w", err)
	}
	if !ok || t.s.opts.Now().Sub(rec.At) > t.s.opts.IdempotencyTTL {
		return nil, notFound("no idempotency key %q", key)
	}
	return &rec, nil
}

// pruneIdempotency removes up to pruneBatch expired receipts, oldest first.
func (t *Tx) pruneIdempotency() error {
	cutoff := t.s.opts.Now().Add(-t.s.opts.IdempotencyTTL)
	limit := expiryKey(cutoff, "")
	b, byTime := t.bucket(bucketIdempotency), t.bucket(bucketIdempotencyTime)
	var expired [][]byte
	c := byTime.Cursor()
	for k, _ := c.First(); k != nil && len(expired) < pruneBatch; k, _ = c.Next() {
		if bytes.Compare(k[:8], limit[:8]) >= 0 {
			break
		}
		expired = append(expired, append([]byte(nil), k...))
	}
	for _, k := range expired {
		if err := byTime.Delete(k); err != nil {
			return fmt.Errorf("prune idempotency keys: %w", err)
		}
		if err := b.Delete(k[8:]); err != nil {
			return fmt.Errorf("prune idempotency keys: %w", err)
		}
	}
	return nil
}

// expiryKey orders receipts by time: <unix nanos u64><key>.
func expiryKey(at time.Time, key string) []byte {
	ns := at.UnixNano()
	if ns < 0 {
		ns = 0
	}
	return append(u64(uint64(ns)), key...)
}
