// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// A placed deployment's status comes from what its hosts push, as Nomad's
// servers answer an allocation's state from what its client last sent:
// every instance transition reaches the server at once in the instance's
// journal (host link), with the instance as the host's own status shows
// it (InstanceJournal.status_json). deploymentStatus reads the instances
// from the journals and asks the host (a management call over its relay,
// 3-5 ms) only for what no journal carries, or where a journal cannot
// answer:
//
//   - the deployment as the host holds it, its ledger view (memory) and
//     its request counts: the host's last answer stands for them while it
//     is younger than statusFresh and the placement has not changed since
//     (a change's answer shows the change);
//   - a host whose journals of the deployment are fewer than its share
//     (being made), or carry no status (a host of an older version, or
//     one over the bound): its answer, each time, as before;
//   - an adopted deployment (the host's own: the server follows the
//     host's revision from its answers) and a group (its members' status
//     is the group code's): as before;
//   - a host out of reach: its last answer, uncertain, as before.
//
// IMPORTANT: a status never shows an instance older than one already
// shown. A host's journals arrive in the order it sent them (one stream,
// applied on one goroutine, each message numbered by the host's seq); a
// new link's Hello replaces them with the host's journals as they stand
// then, and a late message of the old link is dropped by its link
// generation (onHostMessage). An answer may be ahead of the journals (it
// raced a journal in flight): each instance shown is the newer of its
// journal and the host's last answer, by generation then the time it
// entered its state (one host's clock), so what an answer showed stays
// until a journal passes it.

// statusFresh is how long a host's answer for a deployment stands for
// the parts of its status no journal carries (memory, request counts):
// reads more often than that (a deploy --wait polls every few
// milliseconds) cost the host nothing, and those figures are at most this
// old.
const statusFresh = time.Second

// statusAsks is when the server last asked each host for a deployment's
// status, and the placement's version then.
type statusAsks struct {
	mu sync.Mutex
	m  map[string]statusAsk // "<deployment>\x00<host>", as lastStatus
	// fresh overrides statusFresh when set (nanoseconds; tests).
	fresh atomic.Int64
}

type statusAsk struct {
	at      time.Time
	version uint64
}

// hostStatus is host hs's part of placement p's status: its instances
// from its journals where they answer, the rest from its last answer or a
// new one. False when the host did not answer (out of reach).
func (s *Server) hostStatus(ctx context.Context, p *Placement, hs HostShare) (wire.DeploymentStatus, bool) {
	key := p.Deployment + "\x00" + hs.Host
	insts, journaled := s.journalInstances(p, hs)
	if journaled {
		if st, ok := s.freshAnswer(key, p.Version); ok {
			return withJournals(st, insts), true
		}
	}
	st, ok := s.askStatus(ctx, p, hs.Host, key)
	if ok && journaled {
		st = withJournals(st, insts)
	}
	return st, ok
}

// askStatus asks a host for its status of p's deployment and keeps the
// answer (lastStatus) with when it was asked.
func (s *Server) askStatus(ctx context.Context, p *Placement, host, key string) (wire.DeploymentStatus, bool) {
	asked := time.Now()
	status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(p.Deployment), nil, nil)
	var st wire.DeploymentStatus
	if err != nil || status != http.StatusOK || json.Unmarshal(data, &st) != nil {
		return st, false
	}
	s.statusAsks.mu.Lock()
	defer s.statusAsks.mu.Unlock()
	if prev, had := s.statusAsks.m[key]; had && prev.at.After(asked) {
		return st, true // a later ask answered first: its answer stays
	}
	if s.statusAsks.m == nil {
		s.statusAsks.m = map[string]statusAsk{}
	}
	for k, a := range s.statusAsks.m {
		if asked.Sub(a.at) > s.statusFresh() {
			delete(s.statusAsks.m, k) // stands no more (a deleted deployment's too)
		}
	}
	s.statusAsks.m[key] = statusAsk{at: asked, version: p.Version}
	s.lastStatus.mu.Lock()
	s.lastStatus.m[key] = st
	s.lastStatus.mu.Unlock()
	return st, true
}

// freshAnswer is the host's last answer for key when it stands
// (statusFresh, and the placement still at version); a deleted
// deployment's was dropped (forgetStatus).
func (s *Server) freshAnswer(key string, version uint64) (wire.DeploymentStatus, bool) {
	s.statusAsks.mu.Lock()
	a, had := s.statusAsks.m[key]
	s.statusAsks.mu.Unlock()
	if !had || a.version != version || time.Since(a.at) > s.statusFresh() {
		return wire.DeploymentStatus{}, false
	}
	s.lastStatus.mu.Lock()
	defer s.lastStatus.mu.Unlock()
	st, ok := s.lastStatus.m[key]
	return st, ok
}

// statusFresh is statusFresh, or a test's.
func (s *Server) statusFresh() time.Duration {
	if d := time.Duration(s.statusAsks.fresh.Load()); d != 0 {
		return d
	}
	return statusFresh
}

// journalInstances are the instances of p's deployment on host hs as its
// journals show them, in the host's order; false where the journals
// cannot answer (see the top of this file).
func (s *Server) journalInstances(p *Placement, hs HostShare) ([]wire.InstanceStatus, bool) {
	if !p.Managed() {
		return nil, false
	}
	s.mu.Lock()
	h := s.hosts[hs.Host]
	if h == nil || h.linkCancel == nil || h.made[p.Deployment] < hs.Instances {
		s.mu.Unlock()
		return nil, false
	}
	var js []*hostv1.InstanceJournal
	for _, j := range h.journals {
		if j.GetDeployment() == p.Deployment {
			js = append(js, j)
		}
	}
	s.mu.Unlock()
	out := make([]wire.InstanceStatus, 0, len(js))
	for _, j := range js { // a stored journal is never changed: read without the lock
		var in wire.InstanceStatus
		if len(j.GetStatusJson()) == 0 || json.Unmarshal(j.GetStatusJson(), &in) != nil ||
			in.ID != j.GetInstanceId() || in.State != j.GetState() || in.Generation != j.GetGeneration() {
			return nil, false
		}
		out = append(out, in)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Index < out[b].Index })
	return out, true
}

// withJournals is a host's answer with its instances as the journals show
// them (insts): each the newer of its journal's and the answer's.
func withJournals(answer wire.DeploymentStatus, insts []wire.InstanceStatus) wire.DeploymentStatus {
	said := make(map[string]wire.InstanceStatus, len(answer.Instances))
	for _, in := range answer.Instances {
		said[in.ID] = in
	}
	out := answer
	out.Instances, out.ReadyN = make([]wire.InstanceStatus, 0, len(insts)), 0
	for _, in := range insts {
		if a, had := said[in.ID]; had && newerInstance(a, in) {
			in = a
		}
		if in.State == string(structs.StateReady) {
			out.ReadyN++
		}
		out.Instances = append(out.Instances, in)
	}
	return out
}

// newerInstance reports whether a shows a later state of an instance than
// b: a later generation, or the same one entered later (one host's clock).
func newerInstance(a, b wire.InstanceStatus) bool {
	if a.Generation != b.Generation {
		return a.Generation > b.Generation
	}
	return a.Since.After(b.Since)
}
