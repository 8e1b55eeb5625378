// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// noHostToDetect notes a dry run that found no host linked: nothing was
// detected, and the registration would still be the cluster's.
const noHostToDetect = "no host is linked: nothing was detected; each host checks the installation when it links " +
	"and registers it or refuses it (capyctl list hosts shows each host's engines)"

// addEngine answers POST /engines: a dry run (the installation detected,
// nothing registered) and ?host=NAME (a registration on that host alone)
// go to one host; anything else is the cluster's (Engines.RegisterEngine).
func (e *endpoints) addEngine(w http.ResponseWriter, r *http.Request) {
	body, err := ReadBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req wire.EngineAddRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Name == "" {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not an engine registration with a name: %v", err))
		return
	}
	if req.DryRun && r.URL.Query().Get("host") == "" && len(e.s.Reachable()) == 0 {
		// No host to detect the installation on: the registration is the
		// cluster's all the same, and each host checks it when it links.
		writeJSON(w, http.StatusOK, wire.EngineDetected{APIVersion: wire.APIVersion,
			Engine: wire.Engine{Name: req.Name, Family: req.Family, Path: req.Path}, Notes: []string{noHostToDetect}})
		return
	}
	if req.DryRun || r.URL.Query().Get("host") != "" {
		e.toOneHost(w, r, body)
		return
	}
	out, err := e.s.RegisterEngine(r.Context(), req, body)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

// removeEngine answers DELETE /engines/{name}: a registration of the
// cluster is taken back from every host (engine_in_use, and nothing
// removed, when a host still runs a deployment with it); one made on the
// hosts themselves goes to every reachable host as before.
func (e *endpoints) removeEngine(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	registered, err := e.s.RemoveEngine(r.Context(), name)
	if !registered {
		e.toAllHosts(w, r)
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Removed{APIVersion: wire.APIVersion, Removed: name})
}

// toOneHost relays a request to the host ?host= names, or to the first
// reachable host, and copies its answer.
func (e *endpoints) toOneHost(w http.ResponseWriter, r *http.Request, body []byte) {
	host := r.URL.Query().Get("host")
	if host == "" {
		hosts := e.s.Reachable()
		if len(hosts) == 0 {
			writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host is connected to the server (capyctl list hosts)"))
			return
		}
		host = hosts[0]
	}
	status, data, err := e.s.Call(r.Context(), host, r.Method, strings.TrimPrefix(r.URL.Path, wire.Prefix), r.Header, body)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
