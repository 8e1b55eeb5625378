// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// UpdateFleet runs apply on the server's replicated state in one
// transaction: either every change apply made lands or none does. The
// replicated log itself is raft's (core/fleet/raftlog): this store keeps
// only the state its entries built, with the index of the last one
// applied (core/fleet/fsm writes it in the same transaction).
func (s *Store) UpdateFleet(apply func(st *FleetState) error) error {
	return s.Update(func(tx *Tx) error { return apply(&FleetState{tx: tx}) })
}

// FleetState reads and writes the server's state machine inside one
// transaction. Keys are the state machine's ("host/<name>",
// "placement/<deployment>", "meta/...").
type FleetState struct{ tx *Tx }

// Put stores v under key as JSON.
func (f *FleetState) Put(key string, v any) error {
	return putJSON(f.tx.bucket(bucketFleetState), []byte(key), v)
}

// Delete removes key.
func (f *FleetState) Delete(key string) error {
	return f.tx.bucket(bucketFleetState).Delete([]byte(key))
}

// Get decodes key into v; false when it is absent.
func (f *FleetState) Get(key string, v any) (bool, error) {
	return getJSON(f.tx.bucket(bucketFleetState), []byte(key), v)
}

// FleetStateList returns every value whose key starts with prefix, raw.
func (s *Store) FleetStateList(prefix string) (map[string]json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	err := s.View(func(tx *Tx) error {
		c := tx.bucket(bucketFleetState).Cursor()
		p := []byte(prefix)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			out[string(k)] = json.RawMessage(bytes.Clone(v))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the server's state: %w", err)
	}
	return out, nil
}

// ReplaceFleetState replaces the whole server state in one transaction:
// every key is removed, then fill writes the new state (a snapshot being
// restored).
func (s *Store) ReplaceFleetState(fill func(st *FleetState) error) error {
	return s.Update(func(tx *Tx) error {
		b := tx.bucket(bucketFleetState)
		// Keys first, deletes after: a bbolt cursor skips a key when the
		// one before it is deleted under it.
		var keys [][]byte
		if err := b.ForEach(func(k, _ []byte) error {
			keys = append(keys, bytes.Clone(k))
			return nil
		}); err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return fill(&FleetState{tx: tx})
	})
}
