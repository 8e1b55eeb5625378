// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// sameInstances refuses an update that changes how many instances a
// placed deployment runs: its spread over hosts stays as placed.
func sameInstances(body []byte, p *fsm.Placement) error {
	var req struct {
		Deployment struct {
			Instances int `json:"instances"`
		} `json:"deployment"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return structs.Errf(structs.CodeInvalidRequest, "the body is not valid JSON: %v", err)
	}
	if n, placed := req.Deployment.Instances, sumShares(p.Hosts); n != 0 && n != placed {
		return structs.Errf(structs.CodeUnsupported, "deployment %s runs %d instance(s) over hosts %s; a server does not re-spread an update's %d: delete it and deploy it again",
			p.Deployment, placed, strings.Join(p.HostNames(), ", "), n).WithDetail("instances", placed)
	}
	return nil
}

func sumShares(shares []fsm.HostShare) int {
	n := 0
	for _, s := range shares {
		n += s.Instances
	}
	return n
}

// sameRevision checks, before any host is changed, that every host of the
// deployment runs the revision an update names: an update refused by one
// host after another took it would leave them at different revisions.
func (e *endpoints) sameRevision(ctx context.Context, body []byte, p *fsm.Placement) error {
	var req struct {
		ExpectedRevision uint64 `json:"expected_revision"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return structs.Errf(structs.CodeInvalidRequest, "the body is not valid JSON: %v", err)
	}
	for _, host := range p.HostNames() {
		status, data, err := e.s.Call(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(p.Deployment), nil, nil)
		if err == nil && status != http.StatusOK {
			err = hostError(host, status, data)
		}
		if err != nil {
			return err
		}
		var st wire.DeploymentStatus
		if err := json.Unmarshal(data, &st); err != nil {
			return structs.Wrap(structs.CodeInternal, err, "host %s's status of %s", host, p.Deployment)
		}
		if req.ExpectedRevision != 0 && st.Revision != req.ExpectedRevision {
			return structs.Errf(structs.CodeRevisionConflict, "deployment %s is at revision %d on host %s, not %d", p.Deployment, st.Revision, host, req.ExpectedRevision).
				WithDetail("host", host).WithDetail("current_revision", st.Revision)
		}
	}
	return nil
}

// withShare rewrites an update body's instance count for one host.
func withShare(body []byte, n int) ([]byte, error) {
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the body is not valid JSON: %v", err)
	}
	if dep, ok := req["deployment"].(map[string]any); ok {
		dep["instances"] = n
		delete(dep, "placement")
	}
	return json.Marshal(req)
}

// InstanceHost maps a deployment-wide instance index to its host and the
// host's own index.
func InstanceHost(p *fsm.Placement, idx int) (string, int, error) {
	for _, hs := range p.Hosts {
		if idx < hs.Instances {
			return hs.Host, idx, nil
		}
		idx -= hs.Instances
	}
	return "", 0, structs.Errf(structs.CodeNotFound, "deployment %s has no instance %d", p.Deployment, idx)
}

func (e *endpoints) instanceAction(w http.ResponseWriter, r *http.Request) {
	v := mux.Vars(r)
	p, err := e.placementOf(v["name"])
	if err != nil {
		writeError(w, err)
		return
	}
	idx, err := strconv.Atoi(v["index"])
	if err != nil || idx < 0 {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "instance index %q is not a non-negative integer", v["index"]))
		return
	}
	if p.Group != nil {
		writeError(w, structs.Errf(structs.CodeUnsupported,
			"%s is a group: its members start, park and stop together (capyctl start|park|stop deployment %s)", p.Deployment, p.Deployment))
		return
	}
	body, err := ReadBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if p.Managed() {
		e.instanceCommand(w, r, p, idx, body)
		return
	}
	e.instanceRelay(w, r, p, idx, body)
}

// instanceCommand answers an action on one instance of a placed
// deployment: a command to its host, with the host's own index.
func (e *endpoints) instanceCommand(w http.ResponseWriter, r *http.Request, p *fsm.Placement, idx int, body []byte) {
	host, local, err := InstanceHost(p, idx)
	if err != nil {
		writeError(w, err)
		return
	}
	var req wire.ActionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not {action, wait, evict}: %v", err))
		return
	}
	e.s.Once(w, r, body, func() (int, any, error) { return e.s.InstanceAction(r.Context(), p, host, local, idx, req) })
}

// instanceRelay relays an action on one instance of an adopted deployment
// to its host, and answers the host's answer with the deployment-wide
// index.
func (e *endpoints) instanceRelay(w http.ResponseWriter, r *http.Request, p *fsm.Placement, idx int, body []byte) {
	host, local, err := InstanceHost(p, idx)
	if err != nil {
		writeError(w, err)
		return
	}
	status, data, err := e.s.Call(r.Context(), host, r.Method, fmt.Sprintf("/deployments/%s/instances/%d/actions", url.PathEscape(p.Deployment), local), r.Header, body)
	if err == nil && status >= 300 {
		err = hostError(host, status, data)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	var ans map[string]any
	if json.Unmarshal(data, &ans) != nil {
		writeError(w, structs.Errf(structs.CodeInternal, "host %s answered an action with %q", host, data))
		return
	}
	if _, ok := ans["instance"]; ok {
		ans["instance"] = idx
	}
	writeJSON(w, status, ans)
}

// toFirstHost answers a read from the first reachable host of the
// deployment.
func (e *endpoints) toFirstHost(w http.ResponseWriter, r *http.Request) {
	p, err := e.placementOf(mux.Vars(r)["name"])
	if err != nil {
		writeError(w, err)
		return
	}
	for _, host := range p.HostNames() {
		if e.s.InReach(host) {
			e.relayAnswer(w, r, host, strings.TrimPrefix(r.URL.RequestURI(), wire.Prefix))
			return
		}
	}
	writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host of %s is in reach", p.Deployment))
}

func (e *endpoints) engineLog(w http.ResponseWriter, r *http.Request) {
	p, err := e.placementOf(mux.Vars(r)["name"])
	if err != nil {
		writeError(w, err)
		return
	}
	idx := 0
	if v := r.URL.Query().Get("instance"); v != "" {
		if idx, err = strconv.Atoi(v); err != nil || idx < 0 {
			writeError(w, structs.Errf(structs.CodeInvalidRequest, "instance must be a non-negative integer"))
			return
		}
	}
	host, local, err := InstanceHost(p, idx)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	q.Set("instance", strconv.Itoa(local))
	e.relayAnswer(w, r, host, "/deployments/"+url.PathEscape(p.Deployment)+"/engine-log?"+q.Encode())
}

// relayAnswer relays a read to one host and copies its answer.
func (e *endpoints) relayAnswer(w http.ResponseWriter, r *http.Request, host, path string) {
	status, data, err := e.s.Call(r.Context(), host, r.Method, path, r.Header, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
