// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// ServerList answers GET /servers: the server cluster as the answering
// server sees it, each member's figures asked of the member itself.
type ServerList struct {
	APIVersion string `json:"api_version"`
	// Raft is false for a server alone (no bootstrap_expect above 1, no
	// server_join): it lists itself only.
	Raft bool `json:"raft"`
	// Self is the answering server's name.
	Self string `json:"self"`
	// Leader is the leader's name ("" during an election).
	Leader string `json:"leader"`
	// Expect is bootstrap_expect; Voters the voters of the current
	// configuration. Degraded is true while Voters < Expect or a voter is
	// unreachable.
	Expect   int          `json:"expect"`
	Voters   int          `json:"voters"`
	Degraded bool         `json:"degraded"`
	Servers  []ServerInfo `json:"servers"`
}

// ServerInfo is one member of the server cluster.
type ServerInfo struct {
	Name string `json:"name"`
	// Address is its cluster address (raft's traffic goes there too).
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
	// State is leader, follower, candidate, shutdown, or unreachable when
	// the answering server could not ask it.
	State     string `json:"state"`
	Term      uint64 `json:"term,omitempty"`
	LastIndex uint64 `json:"last_index,omitempty"`
	// AppliedIndex is the last entry its state machine applied.
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	// Leader is the leader as this member sees it.
	Leader string `json:"leader,omitempty"`
	Error  string `json:"error,omitempty"`
}

// StateSnapshotFormat names a server state snapshot file (Format).
const StateSnapshotFormat = "capyctl-server-state"

// StateSnapshotVersion is the snapshot format this release writes and
// reads.
const StateSnapshotVersion = 1

// StateSnapshot is `capyctl snapshot save`'s file and GET
// /cluster/snapshot's answer: the server's replicated state (hosts and
// placements) with a header. SHA256 is the hex SHA-256 of State in its
// compact JSON form (re-indenting the file keeps it valid; changing a
// byte of the state does not). It holds no secret: no key, no token.
type StateSnapshot struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// CreatedAt is when the answering server encoded it.
	CreatedAt time.Time `json:"created_at"`
	// CAFingerprint is the cluster CA's certificate fingerprint (hex
	// SHA-256): a restore into a cluster of another CA is refused
	// without force, since the hosts it names hold certificates of this
	// one.
	CAFingerprint string `json:"ca_fingerprint"`
	// Server is the server that answered; Raft, Index and Term say where
	// in the replicated log the state was (Index: the server's last
	// applied entry; zero for a server alone).
	Server string `json:"server"`
	Raft   bool   `json:"raft"`
	Index  uint64 `json:"index,omitempty"`
	Term   uint64 `json:"term,omitempty"`
	// Hosts and Placements count what State holds.
	Hosts      int    `json:"hosts"`
	Placements int    `json:"placements"`
	SHA256     string `json:"sha256"`
	// State is the server's state machine snapshot (hosts and placements).
	State json.RawMessage `json:"state"`
}

// StateRestoreRequest is POST /cluster/restore's body.
type StateRestoreRequest struct {
	Snapshot StateSnapshot `json:"snapshot"`
	// Force restores a snapshot of another CA, or over a state that has
	// hosts or placements already.
	Force bool `json:"force,omitempty"`
}

// StateRestored is POST /cluster/restore's answer.
type StateRestored struct {
	APIVersion string `json:"api_version"`
	// Hosts and Placements are what the state holds now.
	Hosts      int `json:"hosts"`
	Placements int `json:"placements"`
	// Replaced counts the hosts and placements the restore removed.
	Replaced int `json:"replaced"`
}

// stateDigest is the hex SHA-256 of state's compact JSON form.
func stateDigest(state json.RawMessage) (string, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, state); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// Seal sets the snapshot's format, version and checksum from its State.
func (s *StateSnapshot) Seal() error {
	d, err := stateDigest(s.State)
	if err != nil {
		return structs.Errf(structs.CodeInternal, "the server state is not JSON: %v", err)
	}
	s.Format, s.Version, s.SHA256 = StateSnapshotFormat, StateSnapshotVersion, d
	return nil
}

// Verify checks the snapshot's format, version and checksum:
// snapshot_invalid names what is wrong.
func (s *StateSnapshot) Verify() error {
	switch {
	case s.Format != StateSnapshotFormat:
		return structs.Errf(structs.CodeSnapshotInvalid, "not a capyctl server state snapshot (format %q, want %q)", s.Format, StateSnapshotFormat)
	case s.Version != StateSnapshotVersion:
		return structs.Errf(structs.CodeSnapshotInvalid, "snapshot format version %d is not the one this release reads (%d)", s.Version, StateSnapshotVersion)
	case len(s.State) == 0 || s.SHA256 == "":
		return structs.Errf(structs.CodeSnapshotInvalid, "the snapshot has no state or no checksum")
	}
	d, err := stateDigest(s.State)
	if err != nil {
		return structs.Errf(structs.CodeSnapshotInvalid, "the snapshot's state is not JSON: %v", err)
	}
	if d != s.SHA256 {
		return structs.Errf(structs.CodeSnapshotInvalid, "the snapshot's checksum does not match its state (sha256 %s, header says %s): the file was changed or cut short", d, s.SHA256)
	}
	return nil
}

// DecodeStateSnapshot parses and verifies a snapshot file.
func DecodeStateSnapshot(data []byte) (*StateSnapshot, error) {
	var s StateSnapshot
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot file does not parse: %v", err)
	}
	if err := s.Verify(); err != nil {
		return nil, err
	}
	return &s, nil
}
