// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
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
