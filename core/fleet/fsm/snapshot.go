// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"time"

	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// snapshotData is the whole state as Snapshot encodes it. Its fields are
// optional when decoded: a snapshot of an older release holds hosts and
// placements only.
type snapshotData struct {
	// Index is the last entry applied when it was taken (raft's snapshot
	// index): a restore records it as applied.
	Index      uint64         `json:"index,omitempty"`
	Cluster    *ClusterRecord `json:"cluster,omitempty"`
	Hosts      []HostRecord   `json:"hosts"`
	Placements []*Placement   `json:"placements"`
	Engines    []EngineRecord `json:"engines,omitempty"`
	// Revocations are removed hosts and servers; Tokens the join tokens'
	// digests (never a token).
	Revocations []revocation      `json:"revocations,omitempty"`
	Tokens      []pki.TokenRecord `json:"tokens,omitempty"`
	// APIKeys are the named keys (digests, never a key); KeysSeeded says
	// the snapshot holds them (a snapshot of an older release does not:
	// a restore keeps the cluster's keys then).
	APIKeys    []structs.APIKey `json:"api_keys,omitempty"`
	KeysSeeded bool             `json:"api_keys_seeded,omitempty"`
}

// Snapshot returns the whole state encoded, for a replicated log's
// snapshot or a backup; Restore takes it back.
func (s *State) Snapshot() ([]byte, error) {
	s.mu.RLock()
	snap := snapshotData{Index: s.applied, Cluster: s.cluster, Hosts: s.hostsLocked(), Placements: s.placementsLocked(),
		Engines: s.enginesLocked(), Revocations: s.revocationsLocked(), Tokens: s.tokensLocked(),
		APIKeys: s.apiKeysLocked(), KeysSeeded: s.keys.seeded}
	data, err := json.Marshal(snap)
	s.mu.RUnlock()
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "encode the server's state")
	}
	return data, nil
}

// SnapshotCounts decodes a snapshot and returns how many hosts and
// placements it holds, refusing one that does not hold together
// (snapshot_invalid).
func SnapshotCounts(data []byte) (hosts, placements int, err error) {
	snap, err := decodeSnapshot(data)
	return len(snap.Hosts), len(snap.Placements), err
}

// decodeSnapshot decodes a Snapshot's encoding and checks it holds
// together: names unique, every placement's hosts among the hosts.
func decodeSnapshot(data []byte) (snapshotData, error) {
	var snap snapshotData
	if err := json.Unmarshal(data, &snap); err != nil {
		return snap, structs.Errf(structs.CodeSnapshotInvalid, "a server state snapshot does not decode: %v", err)
	}
	hosts := map[string]bool{}
	for _, h := range snap.Hosts {
		if h.Name == "" || hosts[h.Name] {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot names host %q twice or without a name", h.Name)
		}
		hosts[h.Name] = true
	}
	deps := map[string]bool{}
	for _, p := range snap.Placements {
		if p == nil || p.Deployment == "" || deps[p.Deployment] {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot has an empty or repeated placement")
		}
		deps[p.Deployment] = true
		for _, hs := range p.Hosts {
			if !hosts[hs.Host] {
				return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot places deployment %s on host %s, which it does not list", p.Deployment, hs.Host)
			}
		}
	}
	engines := map[string]bool{}
	for _, e := range snap.Engines {
		if e.Name == "" || engines[e.Name] {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot names engine %q twice or without a name", e.Name)
		}
		engines[e.Name] = true
	}
	for _, r := range snap.Revocations {
		if r.Name == "" || (r.Kind != "host" && r.Kind != "server") {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot has a revocation of %q %q", r.Kind, r.Name)
		}
	}
	names := map[string]bool{}
	for _, k := range snap.APIKeys {
		if k.Name == "" || names[k.Name] {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot names API key %q twice or without a name", k.Name)
		}
		names[k.Name] = true
	}
	return snap, nil
}

// applyRestored replaces the hosts, placements, engines and revocations
// with a snapshot's in the command's transaction; the cluster's own
// record and its join tokens stay (they are this cluster's, not the
// backup's).
func (s *State) applyRestored(fs *store.FleetState, c Restored) (func(), any, error) {
	snap, err := decodeSnapshot(c.State)
	if err != nil {
		return nil, nil, err
	}
	var keys []string
	for name := range s.hosts {
		keys = append(keys, prefixHost+name)
	}
	for dep := range s.placements {
		keys = append(keys, prefixPlacement+dep)
	}
	for name := range s.engines {
		keys = append(keys, prefixEngine+name)
	}
	for _, r := range s.revocationsLocked() {
		keys = append(keys, revocationKey(r))
	}
	if snap.KeysSeeded {
		// The snapshot's keys replace the cluster's; one of an older
		// release holds none, and the cluster's stay.
		for name := range s.keys.byName {
			keys = append(keys, prefixAPIKey+name)
		}
	}
	for _, k := range keys {
		if err := fs.Delete(k); err != nil {
			return nil, nil, err
		}
	}
	snap.Tokens = nil
	m, err := putSnapshot(fs, snap)
	if err != nil {
		return nil, nil, err
	}
	return func() {
		tokens := s.trust.tokens
		s.hosts, s.placements, s.engines, s.trust = m.hosts, m.placements, m.engines, m.trust
		s.trust.tokens = tokens
		if snap.KeysSeeded {
			m.keys.version = s.keys.version + 1
			s.keys = m.keys
		}
		s.rebuildRoutes()
	}, nil, nil
}

// revocationKey is a revocation's key in the store.
func revocationKey(r revocation) string {
	if r.Kind == "server" {
		return prefixRevokedServer + r.Name
	}
	return prefixRevokedHost + r.Name
}

// snapshotMemory is a snapshot's records as memory holds them.
type snapshotMemory struct {
	hosts      map[string]HostRecord
	placements map[string]*Placement
	engines    map[string]EngineRecord
	trust      trust
	keys       keys
}

// putSnapshot writes a snapshot's records and returns them as memory
// holds them.
func putSnapshot(fs *store.FleetState, snap snapshotData) (snapshotMemory, error) {
	m := snapshotMemory{hosts: make(map[string]HostRecord, len(snap.Hosts)), placements: make(map[string]*Placement, len(snap.Placements)),
		engines: make(map[string]EngineRecord, len(snap.Engines)), trust: newTrust(), keys: newKeys()}
	put := func(k string, v any) error { return fs.Put(k, v) }
	for _, h := range snap.Hosts {
		m.hosts[h.Name] = h
		if err := put(prefixHost+h.Name, h); err != nil {
			return m, err
		}
	}
	for _, p := range snap.Placements {
		m.placements[p.Deployment] = p
		if err := put(prefixPlacement+p.Deployment, p); err != nil {
			return m, err
		}
	}
	for _, e := range snap.Engines {
		m.engines[e.Name] = e
		if err := put(prefixEngine+e.Name, e); err != nil {
			return m, err
		}
	}
	for _, r := range snap.Revocations {
		if r.Kind == "server" {
			m.trust.revokedServers[r.Name] = r.At
		} else {
			m.trust.revokedHosts[r.Name] = r.At
		}
		if err := put(revocationKey(r), r.At); err != nil {
			return m, err
		}
	}
	for _, t := range snap.Tokens {
		m.trust.tokens[t.Hash] = t
		if err := put(prefixToken+t.Hash, t); err != nil {
			return m, err
		}
	}
	if snap.KeysSeeded {
		m.keys.seeded = true
		if err := put(keyKeysSeeded, true); err != nil {
			return m, err
		}
		for _, k := range snap.APIKeys {
			m.keys.byName[k.Name] = k
			if err := put(prefixAPIKey+k.Name, k); err != nil {
				return m, err
			}
		}
	}
	return m, nil
}

// Restore replaces the whole state with a Snapshot's (raft restores its
// latest snapshot at a start, or sends one to a server too far behind):
// the store's in one transaction, then memory, with the snapshot's index
// recorded as applied. A snapshot that does not hold together changes
// nothing.
func (s *State) Restore(data []byte) error {
	snap, err := decodeSnapshot(data)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var m snapshotMemory
	err = s.st.ReplaceFleetState(func(fs *store.FleetState) error {
		var err error
		if m, err = putSnapshot(fs, snap); err != nil {
			return err
		}
		if snap.Cluster != nil {
			if err := fs.Put(keyCluster, snap.Cluster); err != nil {
				return err
			}
		}
		return fs.Put(keyApplied, snap.Index)
	})
	if err != nil {
		return structs.Wrap(structs.CodeStoreUnavailable, err, "restore the server's state")
	}
	m.keys.version = s.keys.version + 1
	s.hosts, s.placements, s.engines, s.trust, s.keys, s.cluster, s.applied = m.hosts, m.placements, m.engines, m.trust, m.keys, snap.Cluster, snap.Index
	s.rebuildRoutes()
	s.publish()
	return nil
}

// WithHostRevocations adds revocations of hosts (name → when) to a
// snapshot's encoding, keeping those it holds: a server that kept
// revocations of its own before they were replicated carries them into
// the log with its state.
func WithHostRevocations(data []byte, revoked map[string]time.Time) ([]byte, error) {
	if len(revoked) == 0 {
		return data, nil
	}
	snap, err := decodeSnapshot(data)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, r := range snap.Revocations {
		if r.Kind == "host" {
			have[r.Name] = true
		}
	}
	for name, at := range revoked {
		if !have[name] {
			snap.Revocations = append(snap.Revocations, revocation{Kind: "host", Name: name, At: at.UTC().Truncate(time.Second)})
		}
	}
	return json.Marshal(snap)
}
