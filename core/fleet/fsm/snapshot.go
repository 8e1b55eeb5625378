// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"

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
}

// Snapshot returns the whole state encoded, for a replicated log's
// snapshot or a backup; Restore takes it back.
func (s *State) Snapshot() ([]byte, error) {
	s.mu.RLock()
	snap := snapshotData{Index: s.applied, Cluster: s.cluster, Hosts: s.hostsLocked(), Placements: s.placementsLocked()}
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
	return snap, nil
}

// applyRestored replaces the hosts and placements with a snapshot's in
// the command's transaction; the cluster's own record stays (it is this
// cluster's, not the backup's).
func (s *State) applyRestored(fs *store.FleetState, c Restored) (func(), any, error) {
	snap, err := decodeSnapshot(c.State)
	if err != nil {
		return nil, nil, err
	}
	for name := range s.hosts {
		if err := fs.Delete(prefixHost + name); err != nil {
			return nil, nil, err
		}
	}
	for dep := range s.placements {
		if err := fs.Delete(prefixPlacement + dep); err != nil {
			return nil, nil, err
		}
	}
	hosts, placements, err := putSnapshot(fs, snap)
	if err != nil {
		return nil, nil, err
	}
	return func() { s.hosts, s.placements = hosts, placements; s.rebuildRoutes() }, nil, nil
}

// putSnapshot writes a snapshot's hosts and placements and returns them
// as memory holds them.
func putSnapshot(fs *store.FleetState, snap snapshotData) (map[string]HostRecord, map[string]*Placement, error) {
	hosts := make(map[string]HostRecord, len(snap.Hosts))
	placements := make(map[string]*Placement, len(snap.Placements))
	for _, h := range snap.Hosts {
		hosts[h.Name] = h
		if err := fs.Put(prefixHost+h.Name, h); err != nil {
			return nil, nil, err
		}
	}
	for _, p := range snap.Placements {
		placements[p.Deployment] = p
		if err := fs.Put(prefixPlacement+p.Deployment, p); err != nil {
			return nil, nil, err
		}
	}
	return hosts, placements, nil
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
	var hosts map[string]HostRecord
	var placements map[string]*Placement
	err = s.st.ReplaceFleetState(func(fs *store.FleetState) error {
		var err error
		if hosts, placements, err = putSnapshot(fs, snap); err != nil {
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
	s.hosts, s.placements, s.cluster, s.applied = hosts, placements, snap.Cluster, snap.Index
	s.rebuildRoutes()
	s.publish()
	return nil
}
