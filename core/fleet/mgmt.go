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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
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
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	h := http.Header{}
	for _, k := range []string{"Content-Type", "Accept", "Idempotency-Key"} {
		if v := hdr.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	if k := h.Get(wire.HeaderIdempotencyKey); k != "" {
		h.Set(wire.HeaderIdempotencyKey, k+"@"+host) // one key per host: a retry replays each host's answer
	}
	resp, err := s.roundTrip(ctx, host, method, wire.Prefix+path, h, "", body)
	if err != nil {
		return 0, nil, structs.Wrap(structs.CodeHostUnreachable, err, "host %s", host).WithDetail("host", host)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, structs.Wrap(structs.CodeHostUnreachable, err, "read host %s's answer", host).WithDetail("host", host)
	}
	return resp.StatusCode, data, nil
}

// hostError turns a host's error answer back into a catalogue error.
func hostError(host string, status int, data []byte) error {
	var env wire.ErrorEnvelope
	if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
		e := structs.Errf(structs.Code(env.Error.Code), "host %s: %s", host, env.Error.Message)
		for k, v := range env.Error.Details {
			e = e.WithDetail(k, v)
		}
		return e.WithDetail("host", host)
	}
	return structs.Errf(structs.CodeInternal, "host %s answered %d", host, status).WithDetail("host", host)
}

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

// statusCache keeps each host's last answer for a deployment, so a
// deployment on a lost host still shows, uncertain.
type statusCache struct {
	mu sync.Mutex
	m  map[string]wire.DeploymentStatus // "<deployment>\x00<host>"
}

// deploymentStatus merges a placement's hosts' statuses into one: the
// instances numbered through the hosts in placement order, each naming its
// host; a host out of reach contributes its last known instances as
// uncertain.
func (s *Server) deploymentStatus(ctx context.Context, p *Placement) wire.DeploymentStatus {
	type answer struct {
		st wire.DeploymentStatus
		ok bool
	}
	answers := make([]answer, len(p.Hosts))
	var wg sync.WaitGroup
	for i, hs := range p.Hosts {
		wg.Add(1)
		go func(i int, host string) {
			defer wg.Done()
			status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(p.Deployment), nil, nil)
			var st wire.DeploymentStatus
			if err == nil && status == http.StatusOK && json.Unmarshal(data, &st) == nil {
				answers[i] = answer{st, true}
				s.lastStatus.mu.Lock()
				s.lastStatus.m[p.Deployment+"\x00"+host] = st
				s.lastStatus.mu.Unlock()
			}
		}(i, hs.Host)
	}
	wg.Wait()
	out := wire.DeploymentStatus{Name: p.Deployment, Routes: p.Routes, Revision: p.Revision, Instances: []wire.InstanceStatus{}}
	idx := 0
	states := map[string]int{}
	for i, hs := range p.Hosts {
		a := answers[i]
		if !a.ok {
			s.lastStatus.mu.Lock()
			cached, had := s.lastStatus.m[p.Deployment+"\x00"+hs.Host]
			s.lastStatus.mu.Unlock()
			if !had {
				for k := 0; k < hs.Instances; k++ {
					out.Instances = append(out.Instances, wire.InstanceStatus{Index: idx, Host: hs.Host, State: stateUncertain})
					idx++
				}
				continue
			}
			a.st = cached
			a.st.Instances = append([]wire.InstanceStatus(nil), cached.Instances...) // the cache's own stays as it is
			for k := range a.st.Instances {
				a.st.Instances[k].State = stateUncertain
			}
			a.st.ReadyN = 0
		}
		if out.Engine == "" {
			out.Engine, out.API, out.Desired, out.Spec, out.UpdatedAt = a.st.Engine, a.st.API, a.st.Desired, a.st.Spec, a.st.UpdatedAt
			out.Revision = a.st.Revision
			if len(a.st.Routes) > 0 {
				out.Routes = a.st.Routes
			}
			out.Memory = a.st.Memory
		}
		out.Requests = sumCounts(out.Requests, a.st.Requests)
		out.ReadyN += a.st.ReadyN
		for _, in := range a.st.Instances {
			in.Index, in.Host, in.ID = idx, hs.Host, structs.InstanceID(p.Deployment, idx)
			idx++
			states[in.State]++
			out.Instances = append(out.Instances, in)
		}
	}
	out.State = mergeState(states, len(out.Instances), out.ReadyN)
	if out.Spec != nil {
		spec := *out.Spec
		spec.Instances = len(out.Instances)
		out.Spec = &spec
	}
	if p.Group != nil {
		s.groupStatus(p, &out)
	}
	return out
}

// sumCounts adds a host's request counts to the sum so far (numbers are
// summed; anything else keeps the first host's).
func sumCounts(sum, add map[string]any) map[string]any {
	if add == nil {
		return sum
	}
	if sum == nil {
		sum = map[string]any{}
	}
	for k, v := range add {
		n, isNum := v.(float64)
		if prev, ok := sum[k].(float64); ok && isNum {
			sum[k] = prev + n
		} else if _, had := sum[k]; !had {
			sum[k] = v
		}
	}
	return sum
}

// mergeState aggregates instance states the way a single role does: all
// alike is that state; some ready is degraded.
func mergeState(states map[string]int, n, ready int) string {
	if n == 0 {
		return string(structs.StateStopped)
	}
	if ready == n {
		return "ready"
	}
	if len(states) == 1 {
		for st := range states {
			return st
		}
	}
	if ready > 0 {
		return "degraded"
	}
	for _, st := range []string{"uncertain", "failed", "starting", "waking", "stopping", "parked"} {
		if states[st] > 0 {
			return st
		}
	}
	return "degraded"
}

func (s *Server) listDeployments(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, wire.DeploymentList{APIVersion: wire.APIVersion, Deployments: s.allStatuses(r.Context())})
}

func (s *Server) allStatuses(ctx context.Context) []wire.DeploymentStatus {
	ps := s.State.Placements()
	out := make([]wire.DeploymentStatus, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func(i int, p *Placement) {
			defer wg.Done()
			out[i] = s.deploymentStatus(ctx, p)
		}(i, p)
	}
	wg.Wait()
	return out
}

func (s *Server) placementOf(name string) (*Placement, error) {
	p, ok := s.State.Placement(name)
	if !ok {
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	return p, nil
}

func (s *Server) getDeployment(w http.ResponseWriter, r *http.Request) {
	p, err := s.placementOf(mux.Vars(r)["name"])
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.deploymentStatus(r.Context(), p))
}

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
	// No adoption and no removal while a placement is made: the hosts'
	// journals of the new instances arrive before it is recorded.
	s.adoptMu.Lock()
	defer s.adoptMu.Unlock()
	if p, ok := s.State.Placement(spec.Name); ok {
		return nil, structs.Errf(structs.CodeConflict, "deployment %s exists at revision %d: update it with PUT and expected_revision (capyctl deploy --revision %d)",
			spec.Name, p.Revision, p.Revision).WithDetail("current_revision", p.Revision)
	}
	if err := s.State.RoutesFree(spec.Name, spec.Routes); err != nil {
		return nil, err
	}
	if spec.IsGroup() {
		return s.createGroup(context.WithoutCancel(r.Context()), r.Header, spec, req.Deployment, req.Activate)
	}
	n := spec.Instances
	if n <= 0 {
		n = 1
	}
	cands := s.candidates(spec.Placement)
	if len(cands) == 0 && spec.Placement != nil && len(spec.Placement.Hosts) > 0 && s.allDraining(spec.Placement.Hosts) {
		return nil, structs.Errf(structs.CodeHostDraining, "every host placement.hosts names (%s) is draining: capyctl drain host NAME --resume",
			strings.Join(spec.Placement.Hosts, ", ")).WithDetail("hosts", spec.Placement.Hosts)
	}
	if len(cands) == 0 {
		return nil, structs.Errf(structs.CodeCapacityBlocked, "no host takes placements now (none joined, every one lost or draining%s): capyctl list hosts",
			hostsClause(spec.Placement)).WithDetail("hosts", map[string]any{})
	}
	// The shares are made and, on a refusal, undone even when the client
	// hangs up meanwhile: an engine the server does not know of must not
	// be left behind.
	ctx := context.WithoutCancel(r.Context())
	attempt := newAttempt()
	shares, refusals, err := s.placeShares(ctx, r.Header, attempt, spec.Name, req.Deployment, req.Activate, n, cands)
	if err != nil {
		return nil, err
	}
	if len(shares) == 0 || sumShares(shares) < n {
		s.rollback(ctx, spec.Name, shares)
		code := structs.CodeCapacityBlocked
		if allCodes(refusals, structs.CodeEngineNotFound) {
			// No host has the engine: not a matter of room.
			code = structs.CodeEngineNotFound
		}
		return nil, structs.Errf(code, "no placement for %d instance(s) of %s: %s", n, spec.Name, describeRefusals(refusals)).
			WithDetail("hosts", refusals)
	}
	p := &Placement{Deployment: spec.Name, Hosts: shares, Routes: spec.Routes, Revision: 1, At: time.Now().UTC()}
	if err := s.apply(fsm.Placed{Placement: p}); err != nil {
		s.rollback(ctx, spec.Name, shares)
		return nil, err
	}
	st := s.deploymentStatus(ctx, p)
	if st.Revision != 0 && st.Revision != p.Revision {
		p.Revision = st.Revision
		_ = s.apply(fsm.Placed{Placement: p})
	}
	return &st, nil
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

// candidate is a host that takes placements, with its most free card.
type candidate struct {
	host string
	free int64
}

// candidates are the hosts that take placements (link up, not draining,
// in placement.hosts when set), most free card memory first, then by name.
func (s *Server) candidates(ps *structs.PlacementSpec) []candidate {
	var allowed map[string]bool
	if ps != nil && len(ps.Hosts) > 0 {
		allowed = map[string]bool{}
		for _, h := range ps.Hosts {
			allowed[h] = true
		}
	}
	var out []candidate
	for _, rec := range s.State.Hosts() {
		if allowed != nil && !allowed[rec.Name] {
			continue
		}
		if free, ok := s.placeable(rec.Name); ok {
			out = append(out, candidate{rec.Name, free})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].free != out[j].free {
			return out[i].free > out[j].free
		}
		return out[i].host < out[j].host
	})
	return out
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

// capacityCodes are the refusals that send a share to the next host.
var capacityCodes = map[structs.Code]bool{
	structs.CodeCapacityBlocked: true, structs.CodeInsufficientDevice: true, structs.CodeInsufficientMemory: true,
	structs.CodeStartupNeedsEmptyHost: true, structs.CodeHostBackedUnavailable: true, structs.CodeInsufficientResources: true,
	structs.CodeEngineNotFound: true, structs.CodeHostUnreachable: true,
}

// placeShares deploys the instances host by host: one instance on each
// candidate in turn, then round again, until n are placed or every host
// refused. It returns the shares placed and each refusing host's answer.
// A refusal that is not about room (a bad spec) ends the placement.
func (s *Server) placeShares(ctx context.Context, hdr http.Header, attempt, name string, depJSON json.RawMessage, activate bool, n int, cands []candidate) ([]HostShare, map[string]any, error) {
	want := map[string]int{}
	order := []string{}
	for i := 0; i < n; i++ {
		h := cands[i%len(cands)].host
		if want[h] == 0 {
			order = append(order, h)
		}
		want[h]++
	}
	refusals := map[string]any{}
	var shares []HostShare
	pending := 0
	tried := map[string]bool{}
	tryHost := func(host string, count int) (bool, error) {
		tried[host] = true
		body, err := withInstances(depJSON, count, activate)
		if err != nil {
			return false, err
		}
		h := hdr.Clone()
		if k := h.Get(wire.HeaderIdempotencyKey); k != "" {
			h.Set(wire.HeaderIdempotencyKey, k+"#"+attempt)
		}
		status, data, err := s.hostCall(ctx, host, http.MethodPost, "/deployments", h, body)
		if err == nil && (status == http.StatusCreated || status == http.StatusOK) {
			// A host records the deployment and answers before its ledger
			// admits the start: wait for that verdict, so that a share the
			// host cannot fit goes to the next host.
			if activate {
				err = s.waitAdmitted(ctx, host, name)
			}
			if err == nil {
				shares = append(shares, HostShare{Host: host, Instances: count})
				return true, nil
			}
			// Refused after all: the host's record is removed below.
		}
		if err == nil {
			err = hostError(host, status, data)
		}
		e := structs.AsError(err)
		refusals[host] = map[string]any{"code": string(e.Code), "message": e.Message, "details": e.Details}
		// The host may keep a record of a refused activation, or may have
		// made the deployment before its answer was lost: remove it (a
		// host that has none answers not_found). A conflict is a
		// deployment of that name the host had before: not ours.
		if e.Code != structs.CodeConflict {
			_, _, _ = s.hostCall(ctx, host, http.MethodDelete, "/deployments/"+url.PathEscape(name), nil, nil)
		}
		if !capacityCodes[e.Code] {
			return false, err
		}
		return false, nil
	}
	for _, host := range order {
		ok, err := tryHost(host, want[host])
		if err != nil {
			s.rollback(ctx, name, shares)
			return nil, refusals, err
		}
		if !ok {
			pending += want[host]
		}
	}
	// Shares a host refused go to the hosts not tried yet, one each.
	for _, c := range cands {
		if pending == 0 {
			break
		}
		if tried[c.host] {
			continue
		}
		ok, err := tryHost(c.host, 1)
		if err != nil {
			s.rollback(ctx, name, shares)
			return nil, refusals, err
		}
		if ok {
			pending--
		}
	}
	return shares, refusals, nil
}

// admitWait bounds the wait for a host's ledger to admit a new start; one
// still undecided then is taken as admitted (its status tells the rest).
const admitWait = 30 * time.Second

// waitAdmitted waits until every instance of a deployment a host just
// took is admitted by its ledger (started with a ledger phase, or ready),
// or one was refused
// (stopped or failed with an error): that refusal is returned.
func (s *Server) waitAdmitted(ctx context.Context, host, name string) error {
	deadline := time.Now().Add(admitWait)
	for time.Now().Before(deadline) {
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
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// withInstances rewrites a deploy body for one host's share.
func withInstances(depJSON json.RawMessage, n int, activate bool) ([]byte, error) {
	var dep map[string]any
	if err := json.Unmarshal(depJSON, &dep); err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the deployment is not a JSON object: %v", err)
	}
	dep["instances"] = n
	delete(dep, "placement") // the server's business; a host runs what it is given
	return json.Marshal(map[string]any{"deployment": dep, "activate": activate})
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

// rollback deletes the shares a failed placement already made, whatever
// happened to the request that made them.
func (s *Server) rollback(ctx context.Context, name string, shares []HostShare) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hostCallTimeout)
	defer cancel()
	for _, sh := range shares {
		_, _, _ = s.hostCall(ctx, sh.Host, http.MethodDelete, "/deployments/"+url.PathEscape(name), nil, nil)
	}
}

func (s *Server) deleteDeployment(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	s.adoptMu.Lock() // the hosts' last journals must not adopt it back
	defer s.adoptMu.Unlock()
	p, err := s.placementOf(name)
	if err != nil {
		writeError(w, err)
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
		// Every rank stops before any member's record goes.
		if err := s.groupStop(context.WithoutCancel(r.Context()), p); err != nil {
			writeError(w, err)
			return
		}
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
	s.lastStatus.mu.Lock()
	for k := range s.lastStatus.m {
		if strings.HasPrefix(k, name+"\x00") {
			delete(s.lastStatus.m, k)
		}
	}
	s.lastStatus.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if len(last) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(last)
}

// toEveryHost relays a mutation of a deployment to each of its hosts and
// answers the merged status (the first refusal stops it).
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
	if p.Group != nil {
		if r.Method == http.MethodPut {
			writeError(w, structs.Errf(structs.CodeUnsupported,
				"%s is a group: a new revision of a group is not supported yet; delete it and deploy again", name))
			return
		}
		s.groupAction(w, r, p, body)
		return
	}
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
		b := body
		if r.Method == http.MethodPut {
			if b, err = withShare(body, hs.Instances); err != nil {
				writeError(w, err)
				return
			}
		}
		var (
			status int
			data   []byte
		)
		if r.Method == http.MethodPost && wantsEvict(body) && s.hostRunsGroup(hs.Host) {
			// A group member on the host may be in the way: only the server
			// evicts a group (all of its members), so this start waits for
			// the host's verdict here and, refused for a group, parks it and
			// tries again.
			err = s.callWait(r.Context(), hs.Host, name, wire.ActionStart, true)
			if err != nil && s.evictGroups(r.Context(), name, err) {
				err = s.callWait(r.Context(), hs.Host, name, wire.ActionStart, true)
			}
			status, data = http.StatusOK, nil
		} else {
			status, data, err = s.hostCall(r.Context(), hs.Host, r.Method, path, r.Header, b)
			if err == nil && status >= 300 {
				err = hostError(hs.Host, status, data)
			}
		}
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

// sameInstances refuses an update that changes how many instances a
// placed deployment runs: its spread over hosts stays as placed.
func sameInstances(body []byte, p *Placement) error {
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

// sameRevision checks, before any host is changed, that every host of the
// deployment runs the revision an update names: an update refused by one
// host after another took it would leave them at different revisions.
func (s *Server) sameRevision(ctx context.Context, body []byte, p *Placement) error {
	var req struct {
		ExpectedRevision uint64 `json:"expected_revision"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return structs.Errf(structs.CodeInvalidRequest, "the body is not valid JSON: %v", err)
	}
	for _, host := range p.HostNames() {
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(p.Deployment), nil, nil)
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

// instanceHost maps a deployment-wide instance index to its host and the
// host's own index.
func instanceHost(p *Placement, idx int) (string, int, error) {
	for _, hs := range p.Hosts {
		if idx < hs.Instances {
			return hs.Host, idx, nil
		}
		idx -= hs.Instances
	}
	return "", 0, structs.Errf(structs.CodeNotFound, "deployment %s has no instance %d", p.Deployment, idx)
}

func (s *Server) instanceAction(w http.ResponseWriter, r *http.Request) {
	v := mux.Vars(r)
	p, err := s.placementOf(v["name"])
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
	host, local, err := instanceHost(p, idx)
	if err != nil {
		writeError(w, err)
		return
	}
	body, err := readMgmtBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	status, data, err := s.hostCall(r.Context(), host, r.Method, fmt.Sprintf("/deployments/%s/instances/%d/actions", url.PathEscape(p.Deployment), local), r.Header, body)
	if err == nil && status >= 300 {
		err = hostError(host, status, data)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	// The host's answer, with the deployment-wide index.
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
func (s *Server) toFirstHost(w http.ResponseWriter, r *http.Request) {
	p, err := s.placementOf(mux.Vars(r)["name"])
	if err != nil {
		writeError(w, err)
		return
	}
	for _, host := range p.HostNames() {
		if _, ok := s.relayOf(host); ok {
			s.relayAnswer(w, r, host, strings.TrimPrefix(r.URL.RequestURI(), wire.Prefix))
			return
		}
	}
	writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host of %s is in reach", p.Deployment))
}

func (s *Server) engineLog(w http.ResponseWriter, r *http.Request) {
	p, err := s.placementOf(mux.Vars(r)["name"])
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
	host, local, err := instanceHost(p, idx)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	q.Set("instance", strconv.Itoa(local))
	s.relayAnswer(w, r, host, "/deployments/"+url.PathEscape(p.Deployment)+"/engine-log?"+q.Encode())
}

// relayAnswer relays a read to one host and copies its answer.
func (s *Server) relayAnswer(w http.ResponseWriter, r *http.Request, host, path string) {
	status, data, err := s.hostCall(r.Context(), host, r.Method, path, r.Header, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// ---------------------------------------------------------------- engines and hosts

func (s *Server) listEngines(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, wire.EngineList{APIVersion: wire.APIVersion, Engines: s.engines(r.Context())})
}

// engines merges the hosts' registered engines, each name once.
func (s *Server) engines(ctx context.Context) []wire.Engine {
	seen := map[string]bool{}
	out := []wire.Engine{}
	ctx, cancel := context.WithTimeout(ctx, fanOutTimeout)
	defer cancel()
	for _, host := range s.reachable() {
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/engines", nil, nil)
		if err != nil || status != http.StatusOK {
			continue
		}
		var list wire.EngineList
		if json.Unmarshal(data, &list) != nil {
			continue
		}
		for _, e := range list.Engines {
			if !seen[e.Name] {
				seen[e.Name] = true
				out = append(out, e)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// toAllHosts relays an engine registration or removal to every reachable
// host (?host=NAME: that one only) and answers the last host's answer, or
// the first refusal.
func (s *Server) toAllHosts(w http.ResponseWriter, r *http.Request) {
	body, err := readMgmtBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	hosts := s.reachable()
	if only := r.URL.Query().Get("host"); only != "" {
		hosts = []string{only}
	}
	if len(hosts) == 0 {
		writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host is connected to the server (capyctl list hosts)"))
		return
	}
	path := strings.TrimPrefix(r.URL.Path, wire.Prefix)
	var status int
	var data []byte
	for _, host := range hosts {
		status, data, err = s.hostCall(r.Context(), host, r.Method, path, r.Header, body)
		if err == nil && status >= 300 {
			err = hostError(host, status, data)
		}
		if err != nil {
			writeError(w, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// toAnyHost answers a read any host answers alike (a family's flag
// policy).
func (s *Server) toAnyHost(w http.ResponseWriter, r *http.Request) {
	hosts := s.reachable()
	if len(hosts) == 0 {
		writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host is connected to the server (capyctl list hosts)"))
		return
	}
	s.relayAnswer(w, r, hosts[0], strings.TrimPrefix(r.URL.RequestURI(), wire.Prefix))
}

func (s *Server) hostLedger(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if _, ok := s.State.Host(name); !ok {
		writeError(w, structs.Errf(structs.CodeNotFound, "no host %s", name))
		return
	}
	if _, ok := s.relayOf(name); !ok {
		writeError(w, structs.Errf(structs.CodeHostUnreachable, "host %s is out of reach", name).WithDetail("host", name))
		return
	}
	s.relayAnswer(w, r, name, "/hosts/"+url.PathEscape(name)+"/ledger")
}

// hostViews asks each reachable host for a view and returns the answers
// that decoded, by host.
func (s *Server) hostViews(r *http.Request, v func() any) map[string]any {
	out := map[string]any{}
	ctx, cancel := context.WithTimeout(r.Context(), fanOutTimeout)
	defer cancel()
	for _, host := range s.reachable() {
		status, data, err := s.hostCall(ctx, host, http.MethodGet, strings.TrimPrefix(r.URL.RequestURI(), wire.Prefix), nil, nil)
		if err != nil || status != http.StatusOK {
			continue
		}
		dst := v()
		if json.Unmarshal(data, dst) == nil {
			out[host] = dst
		}
	}
	return out
}

// loadView merges the hosts' load views: a deployment's counts summed over
// its hosts, its instances numbered deployment-wide as in its status.
func (s *Server) loadView(w http.ResponseWriter, r *http.Request) {
	merged := map[string]*wire.DeploymentLoad{}
	var order []string
	views := s.hostViews(r, func() any { return &wire.LoadResponse{} })
	for _, p := range s.State.Placements() {
		offset := 0
		for _, hs := range p.Hosts {
			lv, ok := views[hs.Host].(*wire.LoadResponse)
			if !ok {
				offset += hs.Instances
				continue
			}
			for _, dl := range lv.Deployments {
				if dl.Deployment != p.Deployment {
					continue
				}
				m := merged[dl.Deployment]
				if m == nil {
					m = &wire.DeploymentLoad{Deployment: dl.Deployment, Requests: wire.RequestCounts{Places: dl.Requests.Places, MaxWaiting: dl.Requests.MaxWaiting}}
					merged[dl.Deployment] = m
					order = append(order, dl.Deployment)
				}
				c := dl.Requests
				m.Requests.Waiting += c.Waiting
				m.Requests.InFlight += c.InFlight
				m.Requests.SettleWhenIdle += c.SettleWhenIdle
				m.Requests.SettleAtStop += c.SettleAtStop
				m.Requests.SettleOnAbort += c.SettleOnAbort
				for _, ic := range c.Instances {
					ic.ID = globalID(p.Deployment, ic.ID, offset)
					m.Requests.Instances = append(m.Requests.Instances, ic)
				}
				for id, el := range dl.Engines {
					if m.Engines == nil {
						m.Engines = map[string]wire.EngineLoad{}
					}
					m.Engines[globalID(p.Deployment, id, offset)] = el
				}
			}
			offset += hs.Instances
		}
	}
	out := wire.LoadResponse{APIVersion: wire.APIVersion, At: time.Now().UTC(), Deployments: []wire.DeploymentLoad{}}
	for _, name := range order {
		out.Deployments = append(out.Deployments, *merged[name])
	}
	writeJSON(w, http.StatusOK, out)
}

// globalID turns a host's instance ID ("demo/0") into the deployment-wide
// one, given the host's first index.
func globalID(dep, id string, offset int) string {
	i := strings.LastIndexByte(id, '/')
	if i < 0 {
		return id
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil {
		return id
	}
	return structs.InstanceID(dep, n+offset)
}

// latencyView lists every host's latency distributions, each naming its
// host.
func (s *Server) latencyView(w http.ResponseWriter, r *http.Request) {
	type latency struct {
		Deployments []map[string]any `json:"deployments"`
	}
	deps := []map[string]any{}
	views := s.hostViews(r, func() any { return &latency{} })
	hosts := make([]string, 0, len(views))
	for h := range views {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		for _, d := range views[h].(*latency).Deployments {
			d["host"] = h
			deps = append(deps, d)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"api_version": wire.APIVersion, "at": time.Now().UTC(), "deployments": deps})
}

// perHostText answers /metrics with the server's own series, then every
// reachable host's, each of those labelled with its host.
func (s *Server) perHostText(w http.ResponseWriter, r *http.Request) {
	r.Header.Del("Accept") // the text format, which the hosts' series follow
	r.Header.Del("Accept-Encoding")
	s.metrics.ServeHTTP(w, r)
	for _, host := range s.reachable() {
		func() {
			ctx, cancel := context.WithTimeout(r.Context(), fanOutTimeout)
			defer cancel()
			resp, err := s.roundTrip(ctx, host, http.MethodGet, "/metrics", nil, "", nil)
			if err != nil {
				return
			}
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				_, _ = w.Write(labelHost(data, host))
			}
		}()
	}
}

// labelHost adds host="<name>" to every sample of a Prometheus text
// exposition.
func labelHost(text []byte, host string) []byte {
	var b bytes.Buffer
	label := `host="` + host + `"`
	for _, line := range strings.Split(string(text), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			if strings.HasPrefix(line, "#") {
				continue // one HELP/TYPE per host would repeat; the samples carry the names
			}
			continue
		}
		if i := strings.IndexByte(line, '{'); i >= 0 {
			line = line[:i+1] + label + "," + line[i+1:]
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			line = line[:i] + "{" + label + "}" + line[i:]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// ---------------------------------------------------------------- snapshot

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, role wire.RoleInfo) {
	seq, err := s.o.Store.LatestEventSeq()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Snapshot{APIVersion: wire.APIVersion, Cursor: s.o.Store.Cursor(seq), TakenAt: time.Now().UTC(), Role: role,
		Deployments: s.allStatuses(r.Context()), Engines: s.engines(r.Context()), Hosts: s.Hosts()})
}

// wantsEvict reports whether an action body asks for a start with evict.
func wantsEvict(body []byte) bool {
	var req wire.ActionRequest
	return json.Unmarshal(body, &req) == nil && req.Action == wire.ActionStart && req.Evict
}
