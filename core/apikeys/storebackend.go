// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"time"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// StoreBackend keeps the keys in a role's own store (standalone; a host
// keeps only its role key): buckets api_keys and api_key_ids.
type StoreBackend struct{ st *store.Store }

// NewStoreBackend returns the store's keys. The first time a store is
// opened with named keys, the role's own key becomes the key named
// default; a default revoked since is not made again.
func NewStoreBackend(st *store.Store, now time.Time) (*StoreBackend, error) {
	err := st.Update(func(tx *store.Tx) error {
		if _, err := tx.Meta(store.MetaAPIKeysSeeded); err == nil {
			return nil
		}
		if _, err := tx.GetAPIKey(structs.DefaultKeyName); structs.HasCode(err, structs.CodeNotFound) {
			rec := RoleKeyRecord(now)
			if err := tx.PutAPIKey(&rec); err != nil {
				return err
			}
		}
		return tx.SetMeta(store.MetaAPIKeysSeeded, now.UTC().Format(time.RFC3339))
	})
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "make the role's key the key named default")
	}
	return &StoreBackend{st: st}, nil
}

// Keys implements Backend.
func (b *StoreBackend) Keys() ([]structs.APIKey, error) { return b.st.APIKeys() }

// CreateKey implements Backend.
func (b *StoreBackend) CreateKey(k *structs.APIKey) error {
	return b.st.Update(func(tx *store.Tx) error {
		if _, err := tx.GetAPIKey(k.Name); err == nil {
			return structs.Errf(structs.CodeAPIKeyExists, "an API key named %q exists (revoke it first, or pick another name)", k.Name)
		}
		return tx.PutAPIKey(k)
	})
}

// UpdateKey implements Backend.
func (b *StoreBackend) UpdateKey(k *structs.APIKey) error {
	return b.st.Update(func(tx *store.Tx) error {
		if _, err := tx.GetAPIKey(k.Name); err != nil {
			return err
		}
		return tx.PutAPIKey(k)
	})
}

// RevokeKey implements Backend.
func (b *StoreBackend) RevokeKey(name string) error {
	return b.st.Update(func(tx *store.Tx) error {
		found, err := tx.DeleteAPIKey(name)
		if err != nil {
			return err
		}
		if !found {
			return structs.Errf(structs.CodeNotFound, "no API key named %q (capyctl list api-keys lists them)", name)
		}
		return nil
	})
}
