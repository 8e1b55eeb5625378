// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"

	"github.com/capyctl/capyctl/core/structs"
)

// PutInstance stores an instance record under its deployment and index.
func (s *Store) PutInstance(r *structs.InstanceRecord) error {
	return s.Update(func(tx *Tx) error { return tx.PutInstance(r) })
}

// PutInstanceEvent stores an instance record, sets the meta values and
// journals the event (when not nil) in one transaction: one synced write
// where each would take one (a lifecycle transition: the record and its
// event; a launch: its charge record too). All of it is stored, or none.
func (s *Store) PutInstanceEvent(r *structs.InstanceRecord, e *structs.Event, meta map[string]string) error {
	return s.Update(func(tx *Tx) error {
		if err := tx.PutInstance(r); err != nil {
			return err
		}
		for k, v := range meta {
			if err := tx.SetMeta(k, v); err != nil {
				return err
			}
		}
		if e != nil {
			if _, err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		return nil
	})
}

// GetInstance returns one instance record, or not_found.
func (s *Store) GetInstance(deployment string, index int) (*structs.InstanceRecord, error) {
	return view(s, func(tx *Tx) (*structs.InstanceRecord, error) { return tx.GetInstance(deployment, index) })
}

// ListInstances returns a deployment's instance records by index (none
// when the deployment has none).
func (s *Store) ListInstances(deployment string) ([]structs.InstanceRecord, error) {
	return view(s, func(tx *Tx) ([]structs.InstanceRecord, error) { return tx.ListInstances(deployment) })
}

// AllInstances returns every instance record, by deployment then index.
func (s *Store) AllInstances() ([]structs.InstanceRecord, error) {
	return view(s, (*Tx).AllInstances)
}

// DeleteInstance removes an instance record, or answers not_found.
func (s *Store) DeleteInstance(deployment string, index int) error {
	return s.Update(func(tx *Tx) error { return tx.DeleteInstance(deployment, index) })
}

// PutInstance is Store.PutInstance inside a transaction.
func (t *Tx) PutInstance(r *structs.InstanceRecord) error {
	if r == nil || r.Deployment == "" || r.Index < 0 {
		return fmt.Errorf("put instance: a record with a deployment and an index >= 0 is required")
	}
	b, err := t.bucket(bucketInstances).CreateBucketIfNotExists([]byte(r.Deployment))
	if err != nil {
		return fmt.Errorf("put instance %s: %w", r.ID(), err)
	}
	if err := putJSON(b, u32(uint32(r.Index)), r); err != nil {
		return fmt.Errorf("put instance %s: %w", r.ID(), err)
	}
	return nil
}

// GetInstance is Store.GetInstance inside a transaction.
func (t *Tx) GetInstance(deployment string, index int) (*structs.InstanceRecord, error) {
	id := structs.InstanceID(deployment, index)
	if index < 0 {
		return nil, notFound("no instance %s", id)
	}
	var r structs.InstanceRecord
	ok, err := getJSON(t.bucket(bucketInstances).Bucket([]byte(deployment)), u32(uint32(index)), &r)
	if err != nil {
		return nil, fmt.Errorf("get instance %s: %w", id, err)
	}
	if !ok {
		return nil, notFound("no instance %s", id)
	}
	return &r, nil
}

// ListInstances is Store.ListInstances inside a transaction.
func (t *Tx) ListInstances(deployment string) ([]structs.InstanceRecord, error) {
	return listJSON[structs.InstanceRecord](t.bucket(bucketInstances).Bucket([]byte(deployment)), "instances of "+deployment)
}

// AllInstances is Store.AllInstances inside a transaction.
func (t *Tx) AllInstances() ([]structs.InstanceRecord, error) {
	out := []structs.InstanceRecord{}
	err := t.bucket(bucketInstances).ForEach(func(name, v []byte) error {
		if v != nil {
			return nil
		}
		list, err := t.ListInstances(string(name))
		if err != nil {
			return err
		}
		out = append(out, list...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteInstance is Store.DeleteInstance inside a transaction. The
// deployment's bucket goes with its last instance.
func (t *Tx) DeleteInstance(deployment string, index int) error {
	id := structs.InstanceID(deployment, index)
	parent := t.bucket(bucketInstances)
	b := parent.Bucket([]byte(deployment))
	if index < 0 || b == nil || b.Get(u32(uint32(index))) == nil {
		return notFound("no instance %s", id)
	}
	if err := b.Delete(u32(uint32(index))); err != nil {
		return fmt.Errorf("delete instance %s: %w", id, err)
	}
	if k, _ := b.Cursor().First(); k == nil {
		if err := deleteNested(parent, []byte(deployment)); err != nil {
			return fmt.Errorf("delete instance %s: %w", id, err)
		}
	}
	return nil
}
