// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// MemoryBackend keeps key records in memory (tests, and a role that keeps
// no named keys).
type MemoryBackend struct {
	mu   sync.Mutex
	recs map[string]structs.APIKey
}

// NewMemoryBackend returns a backend holding recs.
func NewMemoryBackend(recs ...structs.APIKey) *MemoryBackend {
	b := &MemoryBackend{recs: map[string]structs.APIKey{}}
	for _, r := range recs {
		b.recs[r.Name] = r
	}
	return b
}

// Keys implements Backend.
func (b *MemoryBackend) Keys() ([]structs.APIKey, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]structs.APIKey, 0, len(b.recs))
	for _, r := range b.recs {
		out = append(out, r)
	}
	return out, nil
}

// CreateKey implements Backend.
func (b *MemoryBackend) CreateKey(k *structs.APIKey) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.recs[k.Name]; ok {
		return structs.Errf(structs.CodeAPIKeyExists, "an API key named %q exists (revoke it first, or pick another name)", k.Name)
	}
	b.recs[k.Name] = *k
	return nil
}

// UpdateKey implements Backend.
func (b *MemoryBackend) UpdateKey(k *structs.APIKey) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.recs[k.Name]; !ok {
		return structs.Errf(structs.CodeNotFound, "no API key named %q", k.Name)
	}
	b.recs[k.Name] = *k
	return nil
}

// RevokeKey implements Backend.
func (b *MemoryBackend) RevokeKey(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.recs[name]; !ok {
		return structs.Errf(structs.CodeNotFound, "no API key named %q", name)
	}
	delete(b.recs, name)
	return nil
}

// RoleOnly returns a Keeper whose one key is the role's key: the key named
// default, allowed every model, without limits.
func RoleOnly(roleKey string) *Keeper {
	k, err := New(Config{Backend: NewMemoryBackend(RoleKeyRecord(time.Now())), RoleKey: func() string { return roleKey }})
	if err != nil {
		panic(err) // a memory backend never fails
	}
	return k
}
