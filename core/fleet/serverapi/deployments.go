// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
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

// stateUncertain is an instance's state while its host is out of reach:
// the server does not know it, and keeps its charges.
const stateUncertain = "uncertain"

// maxMgmtBody bounds a management body the server relays.
const maxMgmtBody = 1 << 20

// fanOutTimeout bounds a read asked of every host (the engines, the
// views, the metrics, the models): a host that does not answer in time is
// left out of the answer.
const fanOutTimeout = 5 * time.Second

// hostCallTimeout bounds one management call to a host (a deploy waits
// for the engine's activation on the host: the host's own bound is 2 min).
const hostCallTimeout = 150 * time.Second

// ManagementOverrides are the server's answers to the management routes
// that need a lifecycle: each is answered from the hosts, over their
// relays (api.Backend.Override).
func (s *Server) ManagementOverrides(role func() wire.RoleInfo) map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /snapshot":                                      func(w http.ResponseWriter, r *http.Request) { s.snapshot(w, r, role()) },
		"GET /deployments":                                   s.listDeployments,
		"POST /deployments":                                  s.createDeployment,
		"GET /deployments/{name}":                            s.getDeployment,
		"PUT /deployments/{name}":                            s.toEveryHost,
		"DELETE /deployments/{name}":                         s.deleteDeployment,
		"POST /deployments/{name}/actions":                   s.toEveryHost,
		"POST /deployments/{name}/instances/{index}/actions": s.instanceAction,
		"GET /deployments/{name}/effective-config":           s.toFirstHost,
		"GET /deployments/{name}/engine-log":                 s.engineLog,
		"GET /engines":                                       s.listEngines,
		"POST /engines":                                      s.addEngine,
		"DELETE /engines/{name}":                             s.removeEngine,
		"GET /engine-flags/{family}":                         s.toAnyHost,
		"GET /hosts/{name}/ledger":                           s.hostLedger,
		"GET " + api.ViewLoad:                                s.loadView,
		"GET " + api.ViewLatency:                             s.latencyView,
		"GET /metrics":                                       s.perHostText,
	}
}

// hostCall makes one management call on a host; the answer's status and
// body come back as they are.
func (s *Server) hostCall(ctx context.Context, host, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	return s.hostCallWithin(ctx, hostCallTimeout, host, method, path, hdr, body)
}

// hostCallWithin is hostCall bounded by d (a group member's park or wake
// waits for the engine).
func (s *Server) hostCallWithin(ctx context.Context, d time.Duration, host, method, path string, hdr http.Header, body []byte) (int, []byte, error) {
	return s.hostIO.call(ctx, d, host, method, path, hdr, body)
}

// hostError turns a host's error answer back into a catalogue error.
var hostError = linkwire.HostError

// writeJSON and writeError are the management API's own.
var (
	writeJSON  = api.WriteJSON
	writeError = api.WriteManagementError
)

func readMgmtBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxMgmtBody+1))
	if err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "read the body: %v", err)
	}
	if len(data) > maxMgmtBody {
		return nil, structs.Errf(structs.CodeRequestTooLarge, "the body is over %s", structs.FormatBytes(maxMgmtBody))
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
func (s *Server) createDeployment(w http.ResponseWriter, r *http.Request) {
	data, err := readMgmtBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.receipts.Run(w, r, data, func() (int, any, error) {
		st, err := s.create(r, data)
		return http.StatusCreated, st, err
	})
}

// create places a new deployment (createDeployment).
func (s *Server) create(r *http.Request, data []byte) (*wire.DeploymentStatus, error) {
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
	if p, ok := s.State.Placement(spec.Name); ok {
		return nil, structs.Errf(structs.CodeConflict, "deployment %s exists at revision %d: update it with PUT and expected_revision (capyctl deploy --revision %d)",
			spec.Name, p.Revision, p.Revision).WithDetail("current_revision", p.Revision)
	}
	if err := s.State.RoutesFree(spec.Name, spec.Routes); err != nil {
		return nil, err
	}
	if spec.IsGroup() {
		return s.createGroup(r.Context(), spec, req.Deployment, req.Activate)
	}
	return s.createPlaced(r.Context(), spec, req.Deployment, req.Activate)
}

// newAttempt names one placement attempt: the hosts' idempotency keys are
// the client's key, the host and the attempt, so a retry after a rolled
// back attempt is carried out again rather than replayed from a host that
// undid it (the server's own receipt replays a retry of a success).
func newAttempt() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func hostsClause(ps *structs.PlacementSpec) string {
	if ps == nil || len(ps.Hosts) == 0 {
		return ""
	}
	return "; placement.hosts = " + strings.Join(ps.Hosts, ", ")
}

func sumShares(shares []HostShare) int {
	n := 0
	for _, s := range shares {
		n += s.Instances
	}
	return n
}

// allDraining reports whether every named host is joined and draining.
func (s *Server) allDraining(names []string) bool {
	for _, n := range names {
		rec, ok := s.State.Host(n)
		if !ok || !rec.Drained {
			return false
		}
	}
	return true
}

// waitAdmitted waits until every instance of a deployment a host just
// took is admitted by its ledger (started with a ledger phase, or ready),
// or one was refused
// (stopped or failed with an error): that refusal is returned.
func (s *Server) waitAdmitted(ctx context.Context, host, name string) error {
	deadline := time.NewTimer(admitWait)
	defer deadline.Stop()
	for {
		changes := s.hostIO.changes([]string{host})
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(name), nil, nil)
		if err != nil {
			return err
		}
		var st wire.DeploymentStatus
		if status != http.StatusOK || json.Unmarshal(data, &st) != nil {
			return hostError(host, status, data)
		}
		admitted := 0
		for _, in := range st.Instances {
			switch {
			// The start records its ledger phase once the ledger granted it
			// (a deployment that states no memory is charged nothing).
			case in.State == string(structs.StateReady) || len(in.Charges) > 0 ||
				(in.State == string(structs.StateStarting) && in.Phase != ""):
				admitted++
			case (in.State == string(structs.StateStopped) || in.State == string(structs.StateFailed)) && in.LastError != nil:
				return structs.Errf(in.LastError.Code, "host %s: %s", host, in.LastError.Message).WithDetail("host", host)
			}
		}
		if len(st.Instances) > 0 && admitted == len(st.Instances) {
			return nil
		}
		if expired, err := changes.wait(ctx, deadline.C); expired || err != nil {
			return err
		}
	}
}

// allCodes reports whether every host refused with code.
func allCodes(refusals map[string]any, code structs.Code) bool {
	for _, v := range refusals {
		if m, _ := v.(map[string]any); m == nil || m["code"] != string(code) {
			return false
		}
	}
	return len(refusals) > 0
}

func describeRefusals(refusals map[string]any) string {
	var parts []string
	for host, v := range refusals {
		m, _ := v.(map[string]any)
		parts = append(parts, fmt.Sprintf("%s: %v", host, m["message"]))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "no host took it"
	}
	return strings.Join(parts, "; ")
}

func (s *Server) deleteDeployment(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	p, err := s.placementOf(name)
	if err != nil {
		writeError(w, err)
		return
	}
	if p.Managed() {
		if err := s.deletePlaced(r.Context(), p); err != nil {
			writeError(w, err)
			return
		}
		s.forgetStatus(name)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	for _, host := range p.HostNames() {
		if _, ok := s.relayOf(host); !ok {
			e := structs.Errf(structs.CodeHostUnreachable, "host %s, which runs part of %s, is out of reach: the deployment stays until it is back (its engine would be left running)", host, name).
				WithDetail("host", host)
			writeError(w, e)
			return
		}
	}
	if p.Group != nil {
		// Every rank stops before any member's record goes; each host
		// then deletes its member from its share.
		if err := s.deleteGroup(context.WithoutCancel(r.Context()), p); err != nil {
			writeError(w, err)
			return
		}
		s.forgetStatus(name)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var last []byte
	for _, host := range p.HostNames() {
		status, data, err := s.hostCall(r.Context(), host, http.MethodDelete, "/deployments/"+url.PathEscape(name), r.Header, nil)
		if err == nil && status >= 300 && status != http.StatusNotFound {
			err = hostError(host, status, data)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		last = data
	}
	if err := s.apply(fsm.Unplaced{Deployment: name}); err != nil {
		writeError(w, err)
		return
	}
	s.forgetStatus(name)
	w.Header().Set("Content-Type", "application/json")
	if len(last) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(last)
}

// forgetStatus drops what the hosts last said of a deleted deployment.
func (s *Server) forgetStatus(name string) {
	s.lastStatus.mu.Lock()
	defer s.lastStatus.mu.Unlock()
	for k := range s.lastStatus.m {
		if strings.HasPrefix(k, name+"\x00") {
			delete(s.lastStatus.m, k)
		}
	}
}

// toEveryHost changes a deployment: a placed one's desired state (an
// update, a start, a stop, a delete) or a command (a park); a group's
// through the group's own moves; an adopted one's (the host's own) as a
// call relayed to each of its hosts, answering the merged status (the
// first refusal stops it).
func (s *Server) toEveryHost(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	p, err := s.placementOf(name)
	if err != nil {
		writeError(w, err)
		return
	}
	body, err := readMgmtBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if p.Managed() {
		s.changePlaced(w, r, p, body)
		return
	}
	if p.Group != nil {
		if r.Method == http.MethodPut {
			writeError(w, structs.Errf(structs.CodeUnsupported,
				"%s is a group: a new revision of a group is not supported yet; delete it and deploy again", name))
			return
		}
		s.groupAction(w, r, p, body)
		return
	}
	s.changeAdopted(w, r, p, body)
}

// changeAdopted relays a change of an adopted deployment (the host's own)
// to each of its hosts and answers the merged status; the first refusal
// stops it.
func (s *Server) changeAdopted(w http.ResponseWriter, r *http.Request, p *Placement, body []byte) {
	name := p.Deployment
	if r.Method == http.MethodPut {
		if err := sameInstances(body, p); err != nil {
			writeError(w, err)
			return
		}
		if err := s.sameRevision(r.Context(), body, p); err != nil {
			writeError(w, err)
			return
		}
	}
	path := strings.TrimPrefix(r.URL.Path, wire.Prefix)
	code := http.StatusOK
	var answer []byte
	for _, hs := range p.Hosts {
		status, data, err := s.callAdopted(r, hs, path, body)
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
	st := s.deploymentStatus(r.Context(), p)
	if st.Revision != 0 {
		p.Revision = st.Revision
		_ = s.apply(fsm.Placed{Placement: p})
	}
	writeJSON(w, code, st)
}

// callAdopted relays one host's part of a change of an adopted deployment:
// an update carries the host's share of the instances; a start that may
// evict waits for the host's verdict here, since a group member on the
// host may be in the way and only the server evicts a group (all of its
// members): refused for a group, it parks it and tries again.
func (s *Server) callAdopted(r *http.Request, hs HostShare, path string, body []byte) (int, []byte, error) {
	name := mux.Vars(r)["name"]
	if r.Method == http.MethodPost && wantsEvict(body) && s.hostRunsGroup(hs.Host) {
		err := s.callWait(r.Context(), hs.Host, name, wire.ActionStart, true)
		if err != nil && s.evictGroups(r.Context(), name, err) {
			err = s.callWait(r.Context(), hs.Host, name, wire.ActionStart, true)
		}
		return http.StatusOK, nil, err
	}
	b := body
	if r.Method == http.MethodPut {
		var err error
		if b, err = withShare(body, hs.Instances); err != nil {
			return 0, nil, err
		}
	}
	status, data, err := s.hostCall(r.Context(), hs.Host, r.Method, path, r.Header, b)
	if err == nil && status >= 300 {
		err = hostError(hs.Host, status, data)
	}
	return status, data, err
}

// ---------------------------------------------------------------- engines and hosts

// ---------------------------------------------------------------- snapshot

// wantsEvict reports whether an action body asks for a start with evict.
func wantsEvict(body []byte) bool {
	var req wire.ActionRequest
	return json.Unmarshal(body, &req) == nil && req.Action == wire.ActionStart && req.Evict
}
