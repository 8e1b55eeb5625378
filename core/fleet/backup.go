// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// Backups of the server's state (capyctl snapshot save / restore):
//
//   - Save is any server's read: its State.Snapshot (hosts and
//     placements) with a header (format version, the CA's fingerprint,
//     the raft index and term it was read at, created_at) and the SHA-256
//     of the state (wire.StateSnapshot). Nothing secret is in it: the CA's
//     key, the servers' keys and the join tokens stay in each server's
//     pki directory. raft's own snapshots (<state_dir>/raft/snapshots) are
//     the servers' recovery; this file is the operator's.
//   - Restore is a mutation (a follower relays it to the leader): the
//     snapshot is verified (format, checksum, a state that holds
//     together), then committed as one OpRestored command, so every
//     server replaces its state in the same place of the log. A server
//     alone applies it to its store as any command.
//   - A snapshot of another CA is refused (snapshot_ca_mismatch) without
//     force: its hosts hold certificates the new cluster does not trust.
//     A fresh cluster gets the old one's CA by starting its first server
//     from a copy of the old pki directory (ca.crt, ca.key).
//   - A state that already has hosts or placements is replaced only with
//     force (conflict otherwise): engines the hosts run for placements the
//     snapshot lacks would be forgotten, not stopped.

// StateSnapshot returns this server's state with its header (api.Servers).
func (s *Server) StateSnapshot() (wire.StateSnapshot, error) {
	// Read before the state: the state is at this index or after it.
	st := s.cl.node.Stats()
	out := wire.StateSnapshot{CreatedAt: time.Now().UTC(), CAFingerprint: s.CAFingerprint(), Server: s.cl.name, Raft: true,
		Index: st.AppliedIndex, Term: st.Term}
	data, err := s.State.Snapshot()
	if err != nil {
		return out, err
	}
	hosts, placements, err := fsm.SnapshotCounts(data)
	if err != nil {
		return out, err
	}
	out.Hosts, out.Placements, out.State = hosts, placements, data
	if err := out.Seal(); err != nil {
		return out, err
	}
	return out, nil
}

// RestoreState replaces the state with a snapshot's, through the log
// (api.Servers; the leader's call, relayed there from a follower).
func (s *Server) RestoreState(req wire.StateRestoreRequest) (wire.StateRestored, error) {
	snap := req.Snapshot
	if err := snap.Verify(); err != nil {
		return wire.StateRestored{}, err
	}
	hosts, placements, err := fsm.SnapshotCounts(snap.State)
	if err != nil {
		return wire.StateRestored{}, err
	}
	if own := s.CAFingerprint(); snap.CAFingerprint != own && !req.Force {
		return wire.StateRestored{}, structs.Errf(structs.CodeSnapshotCAMismatch,
			"the snapshot was saved on a cluster whose CA is %s; this cluster's is %s: its hosts would not be trusted (start the first server from the old cluster's pki directory, or pass --force)",
			short(snap.CAFingerprint), short(own)).WithDetail("snapshot_ca", snap.CAFingerprint).WithDetail("ca", own)
	}
	if err := s.leaderOnly(); err != nil {
		return wire.StateRestored{}, err
	}
	replaced := len(s.State.Hosts()) + len(s.State.Placements())
	if replaced > 0 && !req.Force {
		return wire.StateRestored{}, structs.Errf(structs.CodeConflict,
			"this cluster's state has %d hosts and %d placements already; a restore replaces them and forgets engines the snapshot does not place (restore into a fresh cluster, or pass --force)",
			len(s.State.Hosts()), len(s.State.Placements()))
	}
	if err := s.apply(fsm.Restored{State: snap.State}); err != nil {
		return wire.StateRestored{}, err
	}
	s.logger.Info("server state restored from a snapshot", "hosts", hosts, "placements", placements,
		"replaced", replaced, "snapshot_server", snap.Server, "snapshot_index", snap.Index, "snapshot_created_at", snap.CreatedAt)
	s.event("state_restored", "", map[string]any{"hosts": hosts, "placements": placements, "replaced": replaced})
	return wire.StateRestored{APIVersion: wire.APIVersion, Hosts: len(s.State.Hosts()), Placements: len(s.State.Placements()), Replaced: replaced}, nil
}

// short is a fingerprint's first 16 hex digits, for a message.
func short(fp string) string {
	if len(fp) > 16 {
		return fp[:16]
	}
	return fp
}
