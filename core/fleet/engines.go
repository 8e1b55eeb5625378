// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// Engine registrations are desired state (fsm.EngineRegistered): `engine
// add` on a server commits the registration, every linked host registers
// it from its share, and a host that links later registers it then. The
// answer waits for the hosts linked now (on their change signals), so a
// bad path is refused at once: when every one of them refuses, the
// registration is taken back.

// engineWait bounds the wait for the linked hosts' answers (a
// registration runs the engine's version check).
const engineWait = 2 * time.Minute

// addEngine answers POST /engines: a dry run (the installation detected,
// nothing registered) and ?host=NAME (a registration on that host alone)
// go to one host; anything else is the cluster's.
func (s *Server) addEngine(w http.ResponseWriter, r *http.Request) {
	body, err := readMgmtBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req wire.EngineAddRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Name == "" {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not an engine registration with a name: %v", err))
		return
	}
	if req.DryRun || r.URL.Query().Get("host") != "" {
		s.toOneHost(w, r, body)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), engineWait)
	defer cancel()
	if err := s.apply(fsm.EngineRegistered{Engine: fsm.EngineRecord{Name: req.Name, Request: body}}); err != nil {
		writeError(w, err)
		return
	}
	done, refused := s.hostAnswers(ctx, s.State.Applied(), "engine", req.Name)
	if len(done) == 0 && len(refused) > 0 {
		// Every linked host refused it: a bad registration, taken back.
		if err := s.apply(fsm.EngineRemoved{Name: req.Name}); err != nil {
			s.logger.Warn("take back an engine every host refused", "engine", req.Name, "error", err)
		}
		writeError(w, firstRefusal(refused))
		return
	}
	out := wire.EngineDetected{APIVersion: wire.APIVersion, Engine: wire.Engine{Name: req.Name, Family: req.Family, Path: req.Path}, Registered: true}
	if e, ok := s.engineOn(r.Context(), done, req.Name); ok {
		out.Engine = e
	}
	out.Notes = engineNotes(done, refused)
	s.event("engine_added", "", map[string]any{"engine": req.Name, "hosts": done})
	writeJSON(w, http.StatusCreated, out)
}

// removeEngine answers DELETE /engines/{name}: a registration of the
// cluster is taken back from every host (engine_in_use, and nothing
// removed, when a host still runs a deployment with it); one made on the
// hosts themselves goes to every reachable host as before.
func (s *Server) removeEngine(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	rec, desired := s.State.Engine(name)
	if !desired {
		s.toAllHosts(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), engineWait)
	defer cancel()
	if err := s.apply(fsm.EngineRemoved{Name: name}); err != nil {
		writeError(w, err)
		return
	}
	if _, refused := s.hostAnswers(ctx, s.State.Applied(), "engine", name); len(refused) > 0 {
		if err := s.apply(fsm.EngineRegistered{Engine: fsm.EngineRecord{Name: name, Request: rec.Request}}); err != nil {
			s.logger.Warn("put back an engine a host could not remove", "engine", name, "error", err)
		}
		writeError(w, firstRefusal(refused))
		return
	}
	s.event("engine_removed", "", map[string]any{"engine": name})
	writeJSON(w, http.StatusOK, wire.Removed{APIVersion: wire.APIVersion, Removed: name})
}

// hostAnswers waits until every host linked now answered a share read at
// index or later (one that holds the change committed at index), and
// sorts them: the hosts that did kind/name, and those that refused it (by
// host). A host that does not answer in time, or whose link breaks, is
// left out of both.
func (s *Server) hostAnswers(ctx context.Context, index uint64, kind, name string) (done []string, refused map[string]*structs.Error) {
	refused = map[string]*structs.Error{}
	for _, host := range s.reachable() {
		a, err := s.waitApplied(ctx, host, index)
		if err != nil {
			s.logger.Warn("no answer from a host to its desired state", "host", host, "error", err)
			continue
		}
		if e := resultOf(a, kind, name); e != nil {
			refused[host] = e
			continue
		}
		done = append(done, host)
	}
	return done, refused
}

// firstRefusal is the refusal of the first host by name, naming every
// host's.
func firstRefusal(refused map[string]*structs.Error) error {
	hosts := make([]string, 0, len(refused))
	for h := range refused {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	first := refused[hosts[0]]
	e := structs.Errf(first.Code, "host %s: %s", hosts[0], first.Message).WithDetail("host", hosts[0])
	byHost := map[string]any{}
	for _, h := range hosts {
		byHost[h] = map[string]any{"code": string(refused[h].Code), "message": refused[h].Message}
	}
	return e.WithDetail("hosts", byHost)
}

// engineNotes say where a cluster registration stands.
func engineNotes(done []string, refused map[string]*structs.Error) []string {
	var notes []string
	if len(done) == 0 && len(refused) == 0 {
		notes = append(notes, "no host is connected: each host registers the engine when it links")
	}
	for h, e := range refused {
		notes = append(notes, "host "+h+" refused it: "+string(e.Code)+": "+e.Message)
	}
	sort.Strings(notes)
	if len(done) > 0 {
		notes = append(notes, "registered on "+strings.Join(done, ", ")+"; hosts that link later register it too")
	}
	return notes
}

// engineOn reads an engine's registration from the first host that has
// it.
func (s *Server) engineOn(ctx context.Context, hosts []string, name string) (wire.Engine, bool) {
	for _, host := range hosts {
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/engines", nil, nil)
		var list wire.EngineList
		if err != nil || status != http.StatusOK || json.Unmarshal(data, &list) != nil {
			continue
		}
		for _, e := range list.Engines {
			if e.Name == name {
				return e, true
			}
		}
	}
	return wire.Engine{}, false
}

// toOneHost relays a request to the host ?host= names, or to the first
// reachable host, and copies its answer.
func (s *Server) toOneHost(w http.ResponseWriter, r *http.Request, body []byte) {
	host := r.URL.Query().Get("host")
	if host == "" {
		hosts := s.reachable()
		if len(hosts) == 0 {
			writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host is connected to the server (capyctl list hosts)"))
			return
		}
		host = hosts[0]
	}
	status, data, err := s.hostCall(r.Context(), host, r.Method, strings.TrimPrefix(r.URL.Path, wire.Prefix), r.Header, body)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
