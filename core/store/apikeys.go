// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	bolt "go.etcd.io/bbolt"
)

// Named API keys (core/apikeys keeps them) and their usage (core/usage):
//
//	api_keys
//	└── <name> .................. structs.APIKey (a digest, never the key)
//	api_key_ids
//	└── <public id> ............. the key's name (a presented key finds its record by it)
//	api_key_use
//	└── <use id> ................ structs.KeyUse (this role's first and last use)
//	usage
//	└── <hour u64 s><key>\x00<model>  structs.KeyUsage, summed
//
// Usage rows are only ever removed from the oldest end (retention).

// MetaAPIKeysSeeded marks a store whose role key was made the key named
// default once: a revoked default is not made again at the next start.
const MetaAPIKeysSeeded = "api_keys_seeded"

// APIKeys returns every key, by name.
func (s *Store) APIKeys() ([]structs.APIKey, error) {
	return view(s, func(tx *Tx) ([]structs.APIKey, error) { return tx.APIKeys() })
}

// APIKeys is Store.APIKeys inside a transaction.
func (t *Tx) APIKeys() ([]structs.APIKey, error) {
	var out []structs.APIKey
	err := t.bucket(bucketAPIKeys).ForEach(func(k, v []byte) error {
		var rec structs.APIKey
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decode api key %q: %w", k, err)
		}
		out = append(out, rec)
		return nil
	})
	return out, err
}

// GetAPIKey returns a key by name, or not_found.
func (t *Tx) GetAPIKey(name string) (*structs.APIKey, error) {
	var rec structs.APIKey
	ok, err := getJSON(t.bucket(bucketAPIKeys), []byte(name), &rec)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, notFound("no API key named %q", name)
	}
	return &rec, nil
}

// PutAPIKey writes a key, replacing the one of the same name (and its
// public identifier's index entry).
func (t *Tx) PutAPIKey(k *structs.APIKey) error {
	if k.Name == "" {
		return fmt.Errorf("put api key: empty name")
	}
	if old, err := t.GetAPIKey(k.Name); err == nil && old.ID != "" && old.ID != k.ID {
		if err := t.bucket(bucketAPIKeyIDs).Delete([]byte(old.ID)); err != nil {
			return fmt.Errorf("put api key: %w", err)
		}
	}
	if k.ID != "" {
		if err := t.bucket(bucketAPIKeyIDs).Put([]byte(k.ID), []byte(k.Name)); err != nil {
			return fmt.Errorf("put api key: %w", err)
		}
	}
	return putJSON(t.bucket(bucketAPIKeys), []byte(k.Name), k)
}

// DeleteAPIKey removes a key, its index entry and this role's record of
// its use; false when there was none.
func (t *Tx) DeleteAPIKey(name string) (bool, error) {
	old, err := t.GetAPIKey(name)
	if structs.HasCode(err, structs.CodeNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if old.ID != "" {
		if err := t.bucket(bucketAPIKeyIDs).Delete([]byte(old.ID)); err != nil {
			return false, fmt.Errorf("delete api key: %w", err)
		}
	}
	if err := t.bucket(bucketAPIKeyUse).Delete([]byte(old.UseID())); err != nil {
		return false, fmt.Errorf("delete api key: %w", err)
	}
	return true, t.bucket(bucketAPIKeys).Delete([]byte(name))
}

// KeyUses returns this role's record of each key's use, by use ID
// (structs.APIKey.UseID).
func (s *Store) KeyUses() (map[string]structs.KeyUse, error) {
	return view(s, func(tx *Tx) (map[string]structs.KeyUse, error) {
		out := map[string]structs.KeyUse{}
		err := tx.bucket(bucketAPIKeyUse).ForEach(func(k, v []byte) error {
			var u structs.KeyUse
			if err := json.Unmarshal(v, &u); err != nil {
				return fmt.Errorf("decode key use %q: %w", k, err)
			}
			out[string(k)] = u
			return nil
		})
		return out, err
	})
}

// PutKeyUses writes the records of keys' use (see Tx.PutKeyUses).
func (s *Store) PutKeyUses(uses map[string]structs.KeyUse) error {
	return s.Update(func(tx *Tx) error { return tx.PutKeyUses(uses) })
}

// PutKeyUses writes the records of keys' use, by use ID; a key no longer
// in api_keys is left out (revoked while its use waited for the write).
func (t *Tx) PutKeyUses(uses map[string]structs.KeyUse) error {
	b, keys := t.bucket(bucketAPIKeyUse), t.bucket(bucketAPIKeys)
	for id, u := range uses {
		if keys.Get([]byte(u.Name)) == nil {
			continue
		}
		if err := putJSON(b, []byte(id), u); err != nil {
			return err
		}
	}
	return nil
}

// usageKey is a usage row's key: its hour, the key's name, a NUL and the
// model.
func usageKey(hour time.Time, key, model string) []byte {
	k := make([]byte, 0, 8+len(key)+1+len(model))
	k = append(k, u64(uint64(max(hour.Unix(), 0)))...)
	k = append(k, key...)
	k = append(k, 0)
	return append(k, model...)
}

// AddUsage adds rows to the stored ones of the same hour, key and model.
func (t *Tx) AddUsage(rows []structs.KeyUsage) error {
	b := t.bucket(bucketUsage)
	for i := range rows {
		r := rows[i]
		r.Hour = r.Hour.UTC().Truncate(time.Hour)
		k := usageKey(r.Hour, r.Key, r.Model)
		var cur structs.KeyUsage
		if _, err := getJSON(b, k, &cur); err != nil {
			return fmt.Errorf("add usage: %w", err)
		}
		cur.Hour, cur.Key, cur.Model = r.Hour, r.Key, r.Model
		cur.Add(&r)
		if err := putJSON(b, k, &cur); err != nil {
			return fmt.Errorf("add usage: %w", err)
		}
	}
	return nil
}

// UsageFilter selects usage rows; empty fields select all.
type UsageFilter struct {
	// Since is the first hour (truncated) of the rows.
	Since time.Time
	Key   string
	Model string
}

// Usage returns the rows the filter selects, oldest hour first.
func (s *Store) Usage(f UsageFilter) ([]structs.KeyUsage, error) {
	return view(s, func(tx *Tx) ([]structs.KeyUsage, error) { return tx.Usage(f) })
}

// Usage is Store.Usage inside a transaction.
func (t *Tx) Usage(f UsageFilter) ([]structs.KeyUsage, error) {
	var out []structs.KeyUsage
	c := t.bucket(bucketUsage).Cursor()
	start := u64(uint64(max(f.Since.UTC().Truncate(time.Hour).Unix(), 0)))
	for k, v := c.Seek(start); k != nil; k, v = c.Next() {
		if len(k) < 9 {
			continue
		}
		key, model, ok := bytes.Cut(k[8:], []byte{0})
		if !ok || (f.Key != "" && string(key) != f.Key) || (f.Model != "" && string(model) != f.Model) {
			continue
		}
		var r structs.KeyUsage
		if err := json.Unmarshal(v, &r); err != nil {
			return nil, fmt.Errorf("decode usage row: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// PruneUsage removes, oldest first, the rows of hours before cutoff, at
// most budget of them; it returns how many went.
func (t *Tx) PruneUsage(cutoff time.Time, budget int) (int, error) {
	b := t.bucket(bucketUsage)
	limit := uint64(max(cutoff.Unix(), 0))
	var gone [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && len(gone) < budget && readU64(k) < limit; k, _ = c.Next() {
		gone = append(gone, append([]byte(nil), k...))
	}
	for _, k := range gone {
		if err := b.Delete(k); err != nil {
			return 0, fmt.Errorf("prune usage: %w", err)
		}
	}
	return len(gone), nil
}

func migrateV5(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketAPIKeys, bucketAPIKeyIDs, bucketAPIKeyUse, bucketUsage} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}
