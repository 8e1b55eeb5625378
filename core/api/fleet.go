// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// Fleet is the server role's joined hosts: join tokens, each host's
// record, drain and removal. A standalone role has none (Backend.Fleet is
// nil) and these routes answer unsupported.
type Fleet interface {
	// NewJoinToken makes a one-time join token (ttl 0: the default).
	NewJoinToken(hostName string, ttl time.Duration) (wire.JoinToken, error)
	// Host returns one host's record (not_found for an unknown name).
	Host(name string) (wire.HostDetail, error)
	// Drain stops (true) or resumes (false) new placements on a host.
	Drain(name string, drain bool) error
	// Remove revokes a host's certificate at once, closes its link and
	// forgets it.
	Remove(name string) error
}

// DefaultJoinTokenTTL is a join token's life when the request sets none.
const DefaultJoinTokenTTL = time.Hour

func (b *Backend) fleet() (Fleet, error) {
	if b.Fleet == nil {
		return nil, structs.Errf(structs.CodeUnsupported, "this role has no joined hosts: join tokens and host actions belong to the server role (capyctl start server)")
	}
	return b.Fleet, nil
}

func (b *Backend) createJoinToken(w http.ResponseWriter, r *http.Request) {
	f, err := b.fleet()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.JoinTokenRequest
	if err := decodeOptional(r, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	ttl := DefaultJoinTokenTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "ttl %q is not a positive duration (15m, 2h)", req.TTL))
			return
		}
		ttl = d
	}
	var tok wire.JoinToken
	switch req.Role {
	case "", "host":
		tok, err = f.NewJoinToken(req.HostName, ttl)
	case "server":
		var s Servers
		if s, err = b.servers(); err == nil {
			if req.HostName != "" {
				err = structs.Errf(structs.CodeInvalidRequest, "a server join token names no host (the joining server's --hostname is its name)")
			} else {
				tok, err = s.NewServerJoinToken(ttl)
			}
		}
	default:
		err = structs.Errf(structs.CodeInvalidRequest, "role %q is not host or server", req.Role)
	}
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	tok.APIVersion = wire.APIVersion
	writeJSON(w, http.StatusCreated, tok)
}

func (b *Backend) getHost(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if b.Fleet == nil { // standalone: the one host it is
		if b.Hosts != nil {
			for _, h := range b.Hosts() {
				if h.Name == name {
					writeJSON(w, http.StatusOK, wire.HostDetail{APIVersion: wire.APIVersion, Host: h, Instances: []wire.HostInstance{}})
					return
				}
			}
		}
		writeMgmtError(w, structs.Errf(structs.CodeNotFound, "no host %s", name))
		return
	}
	h, err := b.Fleet.Host(name)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	h.APIVersion = wire.APIVersion
	if h.Instances == nil {
		h.Instances = []wire.HostInstance{}
	}
	writeJSON(w, http.StatusOK, h)
}

func (b *Backend) hostAction(w http.ResponseWriter, r *http.Request) {
	f, err := b.fleet()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	var req wire.HostAction
	if err := decodeOptional(r, &req); err != nil {
		writeMgmtError(w, err)
		return
	}
	name := mux.Vars(r)["name"]
	switch req.Action {
	case "drain":
		err = f.Drain(name, true)
	case "resume":
		err = f.Drain(name, false)
	default:
		err = structs.Errf(structs.CodeInvalidRequest, "action %q is not drain or resume", req.Action)
	}
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	h, err := f.Host(name)
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	h.APIVersion = wire.APIVersion
	writeJSON(w, http.StatusOK, h)
}

func (b *Backend) removeHost(w http.ResponseWriter, r *http.Request) {
	f, err := b.fleet()
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	if err := f.Remove(mux.Vars(r)["name"]); err != nil {
		writeMgmtError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeOptional decodes a JSON body into v; an empty body leaves v as it
// is.
func decodeOptional(r *http.Request, v any) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return structs.Errf(structs.CodeInvalidRequest, "the body is not valid JSON: %v", err)
	}
	return nil
}
