// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/capyctl/capyctl/core/fleet/fsm"
)

// stateMachine is raft's view of the server's state machine: every
// committed entry goes to fsm.State.ApplyEntry, a snapshot is
// State.Snapshot and a restore State.Restore.
type stateMachine struct {
	state  *fsm.State
	logger hclog.Logger
	// closing is closed when the node stops: an apply blocked on a halted
	// state returns then.
	closing chan struct{}
	// restores counts Restore calls (a test reads it: a joining server
	// that was sent a snapshot).
	restores atomic.Int64
	// configured is called when a configuration entry is applied here, or
	// a snapshot restored (the node publishes its change).
	configured func()
}

var (
	_ raft.FSM                = (*stateMachine)(nil)
	_ raft.ConfigurationStore = (*stateMachine)(nil)
)

// StoreConfiguration is raft's word that a configuration entry was
// committed and reached this server's state machine (on every server,
// followers included, where raft observes no configuration change): the
// node's waiters learn it (a server joined or was removed).
func (m *stateMachine) StoreConfiguration(uint64, raft.Configuration) {
	if m.configured != nil {
		m.configured()
	}
}

// Apply applies one committed entry and returns its fsm.Result: what the
// leader's Propose answers.
//
// IMPORTANT: once the state halted (a command this server cannot read, a
// store that refuses a write), Apply blocks until the node closes: raft
// must not move its applied index past an entry this server did not
// apply. The server stops on State.Halted and closes the node; on its
// next start the same entry is applied again (its index was not
// recorded), after an upgrade or a repair.
func (m *stateMachine) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return fsm.Result{}
	}
	r := m.state.ApplyEntry(l.Index, l.Data)
	if m.state.HaltErr() != nil {
		<-m.closing
	}
	return r
}

// Snapshot returns the state as it is now; raft persists it while Apply
// goes on.
func (m *stateMachine) Snapshot() (raft.FSMSnapshot, error) {
	data, err := m.state.Snapshot()
	if err != nil {
		return nil, err
	}
	return &snapshot{data: data}, nil
}

// Restore replaces the state with a snapshot's (a server that restarts, or
// one the leader sends a snapshot to because its log no longer reaches
// back far enough).
func (m *stateMachine) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read the snapshot: %w", err)
	}
	if err := m.state.Restore(data); err != nil {
		return err
	}
	m.restores.Add(1)
	if m.configured != nil {
		m.configured() // the snapshot carried a configuration
	}
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
