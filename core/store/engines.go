// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"

	"github.com/capyctl/capyctl/core/structs"
)

// PutEngine stores a registered engine under its name.
func (s *Store) PutEngine(r *structs.EngineRecord) error {
	return s.Update(func(tx *Tx) error { return tx.PutEngine(r) })
}

// GetEngine returns a registered engine, or not_found.
func (s *Store) GetEngine(name string) (*structs.EngineRecord, error) {
	return view(s, func(tx *Tx) (*structs.EngineRecord, error) { return tx.GetEngine(name) })
}

// ListEngines returns every registered engine, by name.
func (s *Store) ListEngines() ([]structs.EngineRecord, error) {
	return view(s, (*Tx).ListEngines)
}

// DeleteEngine removes a registered engine, or answers not_found.
func (s *Store) DeleteEngine(name string) error {
	return s.Update(func(tx *Tx) error { return tx.DeleteEngine(name) })
}

// PutEngine is Store.PutEngine inside a transaction.
func (t *Tx) PutEngine(r *structs.EngineRecord) error {
	if r == nil || r.Name == "" {
		return fmt.Errorf("put engine: a record with a name is required")
	}
	if err := putJSON(t.bucket(bucketEngines), []byte(r.Name), r); err != nil {
		return fmt.Errorf("put engine %s: %w", r.Name, err)
	}
	return nil
}

// GetEngine is Store.GetEngine inside a transaction.
func (t *Tx) GetEngine(name string) (*structs.EngineRecord, error) {
	var r structs.EngineRecord
	ok, err := getJSON(t.bucket(bucketEngines), []byte(name), &r)
	if err != nil {
		return nil, fmt.Errorf("get engine %s: %w", name, err)
	}
	if !ok {
		return nil, notFound("no engine %q", name)
	}
	return &r, nil
}

// ListEngines is Store.ListEngines inside a transaction.
func (t *Tx) ListEngines() ([]structs.EngineRecord, error) {
	return listJSON[structs.EngineRecord](t.bucket(bucketEngines), "engines")
}

// DeleteEngine is Store.DeleteEngine inside a transaction.
func (t *Tx) DeleteEngine(name string) error {
	return deleteKey(t.bucket(bucketEngines), []byte(name), "engine")
}
