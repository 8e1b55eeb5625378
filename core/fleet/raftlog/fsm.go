// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/capyctl/capyctl/core/fleet"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// fsm is raft's view of the server's state machine: every committed entry
// goes to fleet.State.ApplyEncoded, a snapshot is State.Snapshot and a
// restore State.Restore.
type fsm struct {
	state  *fleet.State
	logger hclog.Logger
	// restores counts Restore calls (a test reads it: a joining server
	// that was sent a snapshot).
	restores atomic.Int64
}

var _ raft.FSM = (*fsm)(nil)

// Apply applies one committed entry. Its return value is what the leader's
// Propose returns: nil or the command's refusal.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	err := f.state.ApplyEncoded(l.Data)
	if err == nil {
		return nil
	}
	// A refusal (not_found: a drain of an unknown host; an entry that does
	// not decode) is the same on every server: the state and the entry are
	// the same. A store failure is this server's alone, and its state now
	// lacks a committed command. IMPORTANT: not repaired here; see the
	// package doc.
	if structs.HasCode(err, structs.CodeStoreUnavailable) {
		f.logger.Error("a committed server command was not applied to this server's state", "index", l.Index, "term", l.Term, "error", err)
	}
	return err
}

// Snapshot returns the state as it is now; raft persists it while Apply
// goes on.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	data, err := f.state.Snapshot()
	if err != nil {
		return nil, err
	}
	return &snapshot{data: data}, nil
}

// Restore replaces the state with a snapshot's (a server that restarts, or
// one the leader sends a snapshot to because its log no longer reaches
// back far enough).
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read the snapshot: %w", err)
	}
	if err := f.state.Restore(data); err != nil {
		return err
	}
	f.restores.Add(1)
	return nil
}

// snapshot is the encoded state at one index.
type snapshot struct{ data []byte }

// Persist writes the snapshot to the sink.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.data); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write the snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot (nothing is held).
func (s *snapshot) Release() {}
