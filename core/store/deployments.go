// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"errors"
	"fmt"

	"github.com/capyctl/capyctl/core/structs"
	bolt "go.etcd.io/bbolt"
	boltErrors "go.etcd.io/bbolt/errors"
)

// PutDeployment stores a deployment's current record and files it under
// revisions/<name>/<revision>. Checking the expected revision is the
// caller's (inside the same Update).
func (s *Store) PutDeployment(r *structs.DeploymentRecord) error {
	return s.Update(func(tx *Tx) error { return tx.PutDeployment(r) })
}

// GetDeployment returns a deployment's current record, or not_found.
func (s *Store) GetDeployment(name string) (*structs.DeploymentRecord, error) {
	return view(s, func(tx *Tx) (*structs.DeploymentRecord, error) { return tx.GetDeployment(name) })
}

// ListDeployments returns every deployment's current record, by name.
func (s *Store) ListDeployments() ([]structs.DeploymentRecord, error) {
	return view(s, (*Tx).ListDeployments)
}

// DeleteDeployment removes a deployment with its revisions and instance
// records, or answers not_found.
func (s *Store) DeleteDeployment(name string) error {
	return s.Update(func(tx *Tx) error { return tx.DeleteDeployment(name) })
}

// GetRevision returns one stored revision of a deployment, or not_found.
func (s *Store) GetRevision(name string, rev uint64) (*structs.DeploymentRecord, error) {
	return view(s, func(tx *Tx) (*structs.DeploymentRecord, error) { return tx.GetRevision(name, rev) })
}

// ListRevisions returns every stored revision of a deployment, oldest first.
func (s *Store) ListRevisions(name string) ([]structs.DeploymentRecord, error) {
	return view(s, func(tx *Tx) ([]structs.DeploymentRecord, error) { return tx.ListRevisions(name) })
}

// PutDeployment is Store.PutDeployment inside a transaction.
func (t *Tx) PutDeployment(r *structs.DeploymentRecord) error {
	if r == nil || r.Name == "" {
		return fmt.Errorf("put deployment: a record with a name is required")
	}
	if err := putJSON(t.bucket(bucketDeployments), []byte(r.Name), r); err != nil {
		return fmt.Errorf("put deployment %s: %w", r.Name, err)
	}
	revs, err := t.bucket(bucketRevisions).CreateBucketIfNotExists([]byte(r.Name))
	if err != nil {
		return fmt.Errorf("put deployment %s: %w", r.Name, err)
	}
	if err := putJSON(revs, u64(r.Revision), r); err != nil {
		return fmt.Errorf("put deployment %s revision %d: %w", r.Name, r.Revision, err)
	}
	return nil
}

// GetDeployment is Store.GetDeployment inside a transaction.
func (t *Tx) GetDeployment(name string) (*structs.DeploymentRecord, error) {
	var r structs.DeploymentRecord
	ok, err := getJSON(t.bucket(bucketDeployments), []byte(name), &r)
	if err != nil {
		return nil, fmt.Errorf("get deployment %s: %w", name, err)
	}
	if !ok {
		return nil, notFound("no deployment %q", name)
	}
	return &r, nil
}

// ListDeployments is Store.ListDeployments inside a transaction.
func (t *Tx) ListDeployments() ([]structs.DeploymentRecord, error) {
	return listJSON[structs.DeploymentRecord](t.bucket(bucketDeployments), "deployments")
}

// DeleteDeployment is Store.DeleteDeployment inside a transaction.
func (t *Tx) DeleteDeployment(name string) error {
	b := t.bucket(bucketDeployments)
	if b.Get([]byte(name)) == nil {
		return notFound("no deployment %q", name)
	}
	if err := b.Delete([]byte(name)); err != nil {
		return fmt.Errorf("delete deployment %s: %w", name, err)
	}
	for _, parent := range [][]byte{bucketRevisions, bucketInstances} {
		if err := deleteNested(t.bucket(parent), []byte(name)); err != nil {
			return fmt.Errorf("delete deployment %s: %w", name, err)
		}
	}
	return nil
}

// GetRevision is Store.GetRevision inside a transaction.
func (t *Tx) GetRevision(name string, rev uint64) (*structs.DeploymentRecord, error) {
	var r structs.DeploymentRecord
	ok, err := getJSON(t.bucket(bucketRevisions).Bucket([]byte(name)), u64(rev), &r)
	if err != nil {
		return nil, fmt.Errorf("get deployment %s revision %d: %w", name, rev, err)
	}
	if !ok {
		return nil, notFound("no revision %d of deployment %q", rev, name)
	}
	return &r, nil
}

// ListRevisions is Store.ListRevisions inside a transaction.
func (t *Tx) ListRevisions(name string) ([]structs.DeploymentRecord, error) {
	return listJSON[structs.DeploymentRecord](t.bucket(bucketRevisions).Bucket([]byte(name)), "revisions of "+name)
}

// deleteNested removes a nested bucket; a missing one is not an error.
func deleteNested(parent *bolt.Bucket, name []byte) error {
	err := parent.DeleteBucket(name)
	if errors.Is(err, boltErrors.ErrBucketNotFound) {
		return nil
	}
	return err
}

// listJSON decodes every value of a bucket in key order; a nil bucket
// lists nothing.
func listJSON[T any](b *bolt.Bucket, what string) ([]T, error) {
	out := []T{}
	if b == nil {
		return out, nil
	}
	err := b.ForEach(func(k, v []byte) error {
		if v == nil { // a nested bucket
			return nil
		}
		var item T
		if err := jsonUnmarshal(v, &item); err != nil {
			return fmt.Errorf("decode %s %q: %w", what, k, err)
		}
		out = append(out, item)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return out, nil
}

// view runs fn in a read-only transaction and returns its value.
func view[T any](s *Store, fn func(tx *Tx) (T, error)) (T, error) {
	var out T
	err := s.View(func(tx *Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	return out, err
}
