// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package serverapi is the fleet server's management endpoints: the
// routes a server answers from the hosts and the replicated state (the
// deployments, engines, views and metrics of a role that runs no
// lifecycle of its own). It decodes, routes, relays and merges; the server
// decides, reached only through the Server interface (server.go), so a
// handler is tested against a fake server. core/fleet imports this
// package, never the other way (core/imports_test.go).
package serverapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// MaxBody bounds a management body the server relays.
const MaxBody = 1 << 20

// FanOutTimeout bounds a read asked of every host (the engines, the
// views, the metrics, the models): a host that does not answer in time is
// left out of the answer.
const FanOutTimeout = 5 * time.Second

// endpoints answers the routes for one server.
type endpoints struct {
	s Server
}

// Routes are the server's answers to the management routes that need a
// lifecycle: each is answered from the hosts, over their relays
// (api.Backend.Override).
func Routes(s Server, role func() wire.RoleInfo) map[string]http.HandlerFunc {
	e := &endpoints{s: s}
	return map[string]http.HandlerFunc{
		"GET /snapshot":                                      func(w http.ResponseWriter, r *http.Request) { e.snapshot(w, r, role()) },
		"GET /deployments":                                   e.listDeployments,
		"POST /deployments":                                  e.createDeployment,
		"GET /deployments/{name}":                            e.getDeployment,
		"PUT /deployments/{name}":                            e.toEveryHost,
		"DELETE /deployments/{name}":                         e.deleteDeployment,
		"POST /deployments/{name}/actions":                   e.toEveryHost,
		"POST /deployments/{name}/instances/{index}/actions": e.instanceAction,
		"GET /deployments/{name}/effective-config":           e.toFirstHost,
		"GET /deployments/{name}/engine-log":                 e.engineLog,
		"GET /engines":                                       e.listEngines,
		"POST /engines":                                      e.addEngine,
		"DELETE /engines/{name}":                             e.removeEngine,
		"GET /engine-flags/{family}":                         e.toAnyHost,
		"GET /hosts/{name}/ledger":                           e.hostLedger,
		"GET " + api.ViewLoad:                                e.loadView,
		"GET " + api.ViewLatency:                             e.latencyView,
		"GET /metrics":                                       e.perHostText,
	}
}

// hostError turns a host's error answer back into a catalogue error.
var hostError = linkwire.HostError

// writeJSON and writeError are the management API's own.
var (
	writeJSON  = api.WriteJSON
	writeError = api.WriteManagementError
)

// ReadBody reads a management body of at most MaxBody bytes.
func ReadBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "read the body: %v", err)
	}
	if len(data) > MaxBody {
		return nil, structs.Errf(structs.CodeRequestTooLarge, "the body is over %s", structs.FormatBytes(MaxBody))
	}
	return data, nil
}

// ---------------------------------------------------------------- deployments

// createDeployment places a new deployment: its instances spread over the
// hosts that take placements, most free card memory first (as the hosts'
// last heartbeats said), one instance per host while hosts remain; each
// host's own ledger admits its share or refuses, and a refused share
// tries the next host. A deployment no host admits is capacity_blocked
// with each host's refusal.
func (e *endpoints) createDeployment(w http.ResponseWriter, r *http.Request) {
	data, err := ReadBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	e.s.Once(w, r, data, func() (int, any, error) {
		st, err := e.create(r, data)
		return http.StatusCreated, st, err
	})
}

// create places a new deployment (createDeployment).
func (e *endpoints) create(r *http.Request, data []byte) (*wire.DeploymentStatus, error) {
	var req struct {
		Deployment       json.RawMessage `json:"deployment"`
		Activate         bool            `json:"activate"`
		ExpectedRevision uint64          `json:"expected_revision"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || len(req.Deployment) == 0 {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the body is not {deployment, activate}: %v", err)
	}
	spec, err := jobspec.FromJSON(req.Deployment)
	if err != nil {
		return nil, err
	}
	if p, ok := e.s.Placement(spec.Name); ok {
		return nil, structs.Errf(structs.CodeConflict, "deployment %s exists at revision %d: update it with PUT and expected_revision (capyctl deploy --revision %d)",
			spec.Name, p.Revision, p.Revision).WithDetail("current_revision", p.Revision)
	}
	return e.s.Create(r.Context(), spec, req.Deployment, req.Activate)
}

// placementOf is a deployment's placement, or not_found.
func (e *endpoints) placementOf(name string) (*fsm.Placement, error) {
	p, ok := e.s.Placement(name)
	if !ok {
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	return p, nil
}

func (e *endpoints) deleteDeployment(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	p, err := e.placementOf(name)
	if err != nil {
		writeError(w, err)
		return
	}
	if p.Managed() {
		if err := e.s.Delete(r.Context(), p); err != nil {
			writeError(w, err)
			return
		}
		e.s.ForgetStatus(name)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	for _, host := range p.HostNames() {
		if !e.s.InReach(host) {
			writeError(w, structs.Errf(structs.CodeHostUnreachable, "host %s, which runs part of %s, is out of reach: the deployment stays until it is back (its engine would be left running)", host, name).
				WithDetail("host", host))
			return
		}
	}
	if p.Group != nil {
		// Every rank stops before any member's record goes; each host
		// then deletes its member from its share.
		if err := e.s.DeleteGroup(context.WithoutCancel(r.Context()), p); err != nil {
			writeError(w, err)
			return
		}
		e.s.ForgetStatus(name)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	e.deleteAdopted(w, r, p)
}

// deleteAdopted deletes an adopted deployment on each of its hosts, then
// forgets it; the last host's answer stands for all.
func (e *endpoints) deleteAdopted(w http.ResponseWriter, r *http.Request, p *fsm.Placement) {
	name := p.Deployment
	var last []byte
	for _, host := range p.HostNames() {
		status, data, err := e.s.Call(r.Context(), host, http.MethodDelete, "/deployments/"+url.PathEscape(name), r.Header, nil)
		if err == nil && status >= 300 && status != http.StatusNotFound {
			err = hostError(host, status, data)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		last = data
	}
	if err := e.s.Unplace(name); err != nil {
		writeError(w, err)
		return
	}
	e.s.ForgetStatus(name)
	w.Header().Set("Content-Type", "application/json")
	if len(last) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(last)
}

// toEveryHost changes a deployment: a placed one's desired state (an
// update, a start, a stop, a delete) or a command (a park); a group's
// through the group's own moves; an adopted one's (the host's own) as a
// call relayed to each of its hosts, answering the merged status (the
// first refusal stops it).
func (e *endpoints) toEveryHost(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	p, err := e.placementOf(name)
	if err != nil {
		writeError(w, err)
		return
	}
	body, err := ReadBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if p.Managed() {
		e.changePlaced(w, r, p, body)
		return
	}
	if p.Group != nil {
		e.s.GroupChange(w, r, p, body)
		return
	}
	e.changeAdopted(w, r, p, body)
}

// changePlaced answers PUT and POST .../actions on a placed deployment.
func (e *endpoints) changePlaced(w http.ResponseWriter, r *http.Request, p *fsm.Placement, body []byte) {
	if r.Method == http.MethodPut {
		var req struct {
			Deployment       json.RawMessage `json:"deployment"`
			Activate         bool            `json:"activate"`
			ExpectedRevision uint64          `json:"expected_revision"`
		}
		if err := json.Unmarshal(body, &req); err != nil || len(req.Deployment) == 0 {
			writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not {deployment, expected_revision, activate}: %v", err))
			return
		}
		e.s.Once(w, r, body, func() (int, any, error) {
			st, err := e.s.Update(r.Context(), p, req.Deployment, req.ExpectedRevision, req.Activate)
			return http.StatusOK, st, err
		})
		return
	}
	var req wire.ActionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not {action, wait, evict}: %v", err))
		return
	}
	// A retry with the same Idempotency-Key replays the first answer: a
	// start is not counted twice.
	e.s.Once(w, r, body, func() (int, any, error) { return e.s.Action(r.Context(), p, req) })
}

// changeAdopted relays a change of an adopted deployment (the host's own)
// to each of its hosts and answers the merged status; the first refusal
// stops it.
func (e *endpoints) changeAdopted(w http.ResponseWriter, r *http.Request, p *fsm.Placement, body []byte) {
	name := p.Deployment
	if r.Method == http.MethodPut {
		if err := sameInstances(body, p); err != nil {
			writeError(w, err)
			return
		}
		if err := e.sameRevision(r.Context(), body, p); err != nil {
			writeError(w, err)
			return
		}
	}
	path := strings.TrimPrefix(r.URL.Path, wire.Prefix)
	code := http.StatusOK
	var answer []byte
	for _, hs := range p.Hosts {
		status, data, err := e.callAdopted(r, hs, path, body)
		if err != nil {
			writeError(w, err)
			return
		}
		if data == nil {
			data, _ = json.Marshal(wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: name, Action: wire.ActionStart,
				Revision: p.Revision, AcceptedAt: time.Now().UTC(), Done: true})
		}
		if status == http.StatusAccepted {
			code = status
		}
		answer = data
	}
	if r.Method != http.MethodPut {
		// An action's answer is the host's (the action and its outcome);
		// the last host's stands for all, each having answered alike.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write(answer)
		return
	}
	st := e.s.Status(r.Context(), p)
	if st.Revision != 0 {
		p.Revision = st.Revision
		_ = e.s.Replace(p)
	}
	writeJSON(w, code, st)
}

// callAdopted relays one host's part of a change of an adopted deployment:
// an update carries the host's share of the instances; a start that may
// evict waits for the host's verdict at the server, since a group member
// on the host may be in the way and only the server evicts a group (all
// of its members).
func (e *endpoints) callAdopted(r *http.Request, hs fsm.HostShare, path string, body []byte) (int, []byte, error) {
	if r.Method == http.MethodPost && wantsEvict(body) {
		if handled, err := e.s.StartEvicting(r.Context(), hs.Host, mux.Vars(r)["name"]); handled {
			return http.StatusOK, nil, err
		}
	}
	b := body
	if r.Method == http.MethodPut {
		var err error
		if b, err = withShare(body, hs.Instances); err != nil {
			return 0, nil, err
		}
	}
	status, data, err := e.s.Call(r.Context(), hs.Host, r.Method, path, r.Header, b)
	if err == nil && status >= 300 {
		err = hostError(hs.Host, status, data)
	}
	return status, data, err
}

// wantsEvict reports whether an action body asks for a start with evict.
func wantsEvict(body []byte) bool {
	var req wire.ActionRequest
	return json.Unmarshal(body, &req) == nil && req.Action == wire.ActionStart && req.Evict
}
