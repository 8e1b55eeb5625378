// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	bolt "go.etcd.io/bbolt"
)

// The Responses API's stored responses (core/responses writes them):
//
//	responses ................... sequence = bytes of the records stored (StoredResponse.Size)
//	└── <id> .................... structs.StoredResponse
//	responses_by_time
//	└── <created u64 ns><id> .... (empty) age index, oldest first
//
// Both are only ever trimmed from the oldest end (retention, size bound)
// or by one DELETE.

// PutResponses stores records, replacing one with the same ID.
func (t *Tx) PutResponses(recs []structs.StoredResponse) error {
	b, idx := t.bucket(bucketResponses), t.bucket(bucketResponsesByTime)
	total := b.Sequence()
	for i := range recs {
		r := &recs[i]
		if r.ID == "" {
			return fmt.Errorf("put response: empty id")
		}
		if old := b.Get([]byte(r.ID)); old != nil {
			var prev structs.StoredResponse
			if err := json.Unmarshal(old, &prev); err == nil {
				total -= min(total, uint64(prev.Size()))
				if err := idx.Delete(responseTimeKey(prev.CreatedAt, prev.ID)); err != nil {
					return fmt.Errorf("put response: %w", err)
				}
			}
		}
		data, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("put response: %w", err)
		}
		if err := b.Put([]byte(r.ID), data); err != nil {
			return fmt.Errorf("put response: %w", err)
		}
		if err := idx.Put(responseTimeKey(r.CreatedAt, r.ID), nil); err != nil {
			return fmt.Errorf("put response: %w", err)
		}
		total += uint64(r.Size())
	}
	return b.SetSequence(total)
}

// GetResponse returns a stored response, or not_found.
func (s *Store) GetResponse(id string) (*structs.StoredResponse, error) {
	return view(s, func(tx *Tx) (*structs.StoredResponse, error) { return tx.GetResponse(id) })
}

// GetResponse is Store.GetResponse inside a transaction.
func (t *Tx) GetResponse(id string) (*structs.StoredResponse, error) {
	v := t.bucket(bucketResponses).Get([]byte(id))
	if v == nil {
		return nil, notFound("response %q", id)
	}
	var r structs.StoredResponse
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("read response %q: %w", id, err)
	}
	return &r, nil
}

// DeleteResponse removes a stored response; false when there was none.
func (s *Store) DeleteResponse(id string) (bool, error) {
	var found bool
	err := s.Update(func(tx *Tx) error {
		var err error
		found, err = tx.DeleteResponse(id)
		return err
	})
	return found, err
}

// DeleteResponse is Store.DeleteResponse inside a transaction.
func (t *Tx) DeleteResponse(id string) (bool, error) {
	b, idx := t.bucket(bucketResponses), t.bucket(bucketResponsesByTime)
	v := b.Get([]byte(id))
	if v == nil {
		return false, nil
	}
	var r structs.StoredResponse
	if err := json.Unmarshal(v, &r); err != nil {
		return false, fmt.Errorf("delete response %q: %w", id, err)
	}
	if err := b.Delete([]byte(id)); err != nil {
		return false, fmt.Errorf("delete response %q: %w", id, err)
	}
	if err := idx.Delete(responseTimeKey(r.CreatedAt, r.ID)); err != nil {
		return false, fmt.Errorf("delete response %q: %w", id, err)
	}
	return true, b.SetSequence(b.Sequence() - min(b.Sequence(), uint64(r.Size())))
}

// PruneResponses removes, oldest first, the responses created before
// cutoff and those past maxBytes (all records together), at most budget of
// them; it returns how many went.
func (t *Tx) PruneResponses(cutoff time.Time, maxBytes int64, budget int) (int, error) {
	b, idx := t.bucket(bucketResponses), t.bucket(bucketResponsesByTime)
	total := b.Sequence()
	var gone [][]byte
	c := idx.Cursor()
	for k, _ := c.First(); k != nil && len(gone) < budget; k, _ = c.Next() {
		created := int64(readU64(k))
		if created >= cutoff.UnixNano() && (maxBytes <= 0 || total <= uint64(maxBytes)) {
			break
		}
		gone = append(gone, append([]byte(nil), k...))
		if v := b.Get(k[8:]); v != nil {
			var r structs.StoredResponse
			if json.Unmarshal(v, &r) == nil {
				total -= min(total, uint64(r.Size()))
			}
		}
	}
	for _, k := range gone {
		if err := idx.Delete(k); err != nil {
			return 0, fmt.Errorf("prune responses: %w", err)
		}
		if err := b.Delete(k[8:]); err != nil {
			return 0, fmt.Errorf("prune responses: %w", err)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	return len(gone), b.SetSequence(total)
}

// ResponseBytes returns the weight of the stored responses, all together.
func (s *Store) ResponseBytes() (int64, error) {
	return view(s, func(tx *Tx) (int64, error) { return int64(tx.bucket(bucketResponses).Sequence()), nil })
}

// responseTimeKey is a response's key in the age index.
func responseTimeKey(created time.Time, id string) []byte {
	k := make([]byte, 0, 8+len(id))
	k = append(k, u64(uint64(max(created.UnixNano(), 0)))...)
	return append(k, id...)
}

func migrateV3(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketResponses, bucketResponsesByTime} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}
