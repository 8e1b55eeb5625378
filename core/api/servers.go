// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// Servers is the server role's cluster of servers (raft): the members and
// their removal. A standalone role has none (Backend.Servers is nil).
type Servers interface {
	// Servers lists the cluster's members with their raft figures.
	Servers(ctx context.Context) (wire.ServerList, error)
	// RemoveServer takes a server out of the cluster (the leader's call).
	RemoveServer(name string) error
	// NewServerJoinToken makes a one-time token that joins a server.
	NewServerJoinToken(ttl time.Duration) (wire.JoinToken, error)
	// StateSnapshot returns the replicated state with its header and
	// checksum (any server).
	StateSnapshot() (wire.StateSnapshot, error)
	// RestoreState verifies a snapshot and replaces the state with it
	// through the log (the leader's call).
	RestoreState(req wire.StateRestoreRequest) (wire.StateRestored, error)
}

func (b *Backend) servers() (Servers, error) {
	if b.Servers == nil {
		return nil, structs.Errf(structs.CodeUnsupported, "this role is not a server: the server cluster belongs to the server role (capyctl start server)")
	}
	return b.Servers, nil
}

func (b *Backend) listServers(w http.ResponseWriter, r *http.Request) {
	s, err := b.servers()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	list, err := s.Servers(r.Context())
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	list.APIVersion = wire.APIVersion
	writeJSON(w, http.StatusOK, list)
}

func (b *Backend) removeServer(w http.ResponseWriter, r *http.Request) {
	s, err := b.servers()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	if err := s.RemoveServer(mux.Vars(r)["name"]); err != nil {
		writeMgmtError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *Backend) clusterSnapshot(w http.ResponseWriter, r *http.Request) {
	s, err := b.servers()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	snap, err := s.StateSnapshot()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (b *Backend) clusterRestore(w http.ResponseWriter, r *http.Request) {
	s, err := b.servers()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	data, err := readBody(r)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.StateRestoreRequest
	if err := json.Unmarshal(data, &req); err != nil {
		writeMgmtError(w, structs.Errf(structs.CodeSnapshotInvalid, "the restore request does not parse: %v", err))
		return
	}
	out, err := s.RestoreState(req)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
