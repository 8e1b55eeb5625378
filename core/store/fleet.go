// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// FleetLogKeep is how many applied commands the server's log keeps; older
// ones go as new ones are appended (the state in fleet_state is the
// snapshot they were applied to).
const FleetLogKeep = 10_000

// ApplyFleet appends one server command to the log and runs apply on the
// state in the same transaction: either both land or neither. apply reads
// and writes the state through the FleetState it is given. It returns the
// command's index in the log.
func (s *Store) ApplyFleet(command []byte, apply func(st *FleetState) error) (uint64, error) {
	var index uint64
	err := s.Update(func(tx *Tx) error {
		log := tx.bucket(bucketFleetLog)
		seq, err := log.NextSequence()
		if err != nil {
			return err
		}
		if err := log.Put(u64(seq), command); err != nil {
			return err
		}
		if seq > FleetLogKeep {
			c := log.Cursor()
			for k, _ := c.First(); k != nil && readU64(k) <= seq-FleetLogKeep; k, _ = c.Next() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		index = seq
		return apply(&FleetState{tx: tx})
	})
	return index, err
}

// FleetLogAfter returns the commands after index, oldest first, at most
// limit of them, with their indexes.
func (s *Store) FleetLogAfter(index uint64, limit int) ([]uint64, [][]byte, error) {
	var idx []uint64
	var cmds [][]byte
	err := s.View(func(tx *Tx) error {
		c := tx.bucket(bucketFleetLog).Cursor()
		for k, v := c.Seek(u64(index + 1)); k != nil && len(idx) < limit; k, v = c.Next() {
			idx = append(idx, readU64(k))
			cmds = append(cmds, bytes.Clone(v))
		}
		return nil
	})
	return idx, cmds, err
}

// FleetState reads and writes the server's state machine inside one
// transaction. Keys are the state machine's ("host/<name>",
// "placement/<deployment>").
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
// every key is removed, then fill writes the new state (a replicated log's
// snapshot being restored). The log is left as it is: its entries are
// history, the state is what counts.
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
