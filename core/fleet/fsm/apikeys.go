// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"slices"
	"sort"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// The inference API's named keys are the cluster's (core/apikeys keeps
// them on each server from this part of the state): a key created,
// changed or revoked through any server is committed once and applied by
// every server, whose keeper reloads it at once. A record holds the key's
// digest, never the key.

const (
	prefixAPIKey  = "apikey/"
	keyKeysSeeded = "meta/api_keys_seeded"
)

// Command types of the named keys.
const (
	TypeKeyCreated Type = "api_key_created"
	TypeKeyUpdated Type = "api_key_updated"
	TypeKeyRevoked Type = "api_key_revoked"
)

// KeyCreated records a new key; api_key_exists when the name is taken.
// Seed marks the cluster's first record of its own key (the key named
// default): applied once per cluster, a no-op after (every server may
// propose it at its start).
type KeyCreated struct {
	Key  structs.APIKey `json:"key"`
	Seed bool           `json:"seed,omitempty"`
}

// KeyUpdated replaces a key's record (its scope, limits, weight, expiry);
// not_found without one.
type KeyUpdated struct {
	Key structs.APIKey `json:"key"`
}

// KeyRevoked removes a key; not_found without one.
type KeyRevoked struct {
	Name string `json:"name"`
}

func (KeyCreated) CommandType() Type { return TypeKeyCreated }
func (KeyUpdated) CommandType() Type { return TypeKeyUpdated }
func (KeyRevoked) CommandType() Type { return TypeKeyRevoked }

// keys is the named keys as memory holds them (State.mu).
type keys struct {
	byName map[string]structs.APIKey
	seeded bool
	// version counts the changes, so that a keeper reloads only when the
	// keys changed.
	version uint64
}

func newKeys() keys { return keys{byName: map[string]structs.APIKey{}} }

// loadKey takes one stored key record into memory; false for another key.
func (k *keys) load(key string, v []byte) (bool, error) {
	switch {
	case key == keyKeysSeeded:
		k.seeded = true
		return true, nil
	case len(key) > len(prefixAPIKey) && key[:len(prefixAPIKey)] == prefixAPIKey:
		var r structs.APIKey
		if err := json.Unmarshal(v, &r); err != nil {
			return true, err
		}
		k.byName[r.Name] = r
		return true, nil
	}
	return false, nil
}

func (s *State) applyKeyCreated(fs *store.FleetState, c KeyCreated) (func(), any, error) {
	r := c.Key
	if c.Seed {
		if s.keys.seeded {
			return func() {}, nil, nil
		}
		if err := fs.Put(keyKeysSeeded, true); err != nil {
			return nil, nil, err
		}
		if _, taken := s.keys.byName[r.Name]; taken {
			return func() { s.keys.seeded = true }, nil, nil
		}
	} else if _, taken := s.keys.byName[r.Name]; taken {
		return nil, nil, structs.Errf(structs.CodeAPIKeyExists, "an API key named %q exists (revoke it first, or pick another name)", r.Name)
	}
	if r.Name == "" {
		return nil, nil, structs.Errf(structs.CodeInvalidRequest, "an API key record names the key")
	}
	return func() {
		s.keys.byName[r.Name] = r
		s.keys.seeded = s.keys.seeded || c.Seed
		s.keys.version++
	}, nil, fs.Put(prefixAPIKey+r.Name, r)
}

func (s *State) applyKeyUpdated(fs *store.FleetState, c KeyUpdated) (func(), any, error) {
	r := c.Key
	if _, ok := s.keys.byName[r.Name]; !ok {
		return nil, nil, structs.Errf(structs.CodeNotFound, "no API key named %q (capyctl list api-keys lists them)", r.Name)
	}
	return func() { s.keys.byName[r.Name] = r; s.keys.version++ }, nil, fs.Put(prefixAPIKey+r.Name, r)
}

func (s *State) applyKeyRevoked(fs *store.FleetState, c KeyRevoked) (func(), any, error) {
	if _, ok := s.keys.byName[c.Name]; !ok {
		return nil, nil, structs.Errf(structs.CodeNotFound, "no API key named %q (capyctl list api-keys lists them)", c.Name)
	}
	return func() { delete(s.keys.byName, c.Name); s.keys.version++ }, nil, fs.Delete(prefixAPIKey + c.Name)
}

// APIKeys returns the named keys, by name.
func (s *State) APIKeys() []structs.APIKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.apiKeysLocked()
}

func (s *State) apiKeysLocked() []structs.APIKey {
	out := make([]structs.APIKey, 0, len(s.keys.byName))
	for _, r := range s.keys.byName {
		r.Models = slices.Clone(r.Models)
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// KeysVersion changes with every change of the named keys (and a
// restore): a keeper reloads when it differs from the one it read.
func (s *State) KeysVersion() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.keys.version
}

// KeysSeeded reports whether the cluster recorded its own key as the key
// named default.
func (s *State) KeysSeeded() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.keys.seeded
}
