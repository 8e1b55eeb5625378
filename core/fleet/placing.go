// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/scheduler"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// Placing a deployment is desired state, as Nomad schedules an
// allocation: the leader picks hosts (core/fleet/scheduler), reserves the
// name and routes and writes the shares through raft (a pending
// placement), and each host receives its share and makes it with its own
// lifecycle; its ledger admits it or refuses it. The leader waits for
// each host's verdict on the host's change signal (its answer to the
// share, then its instances' journals), moves a refused share to the next
// host with a change that names the version it replaces, and marks the
// placement placed. No lock is held while hosts work: a concurrent change
// of the same deployment loses on its version (conflict), and two
// deployments of one name or route cannot both be reserved.

// placing reports whether a placed deployment is still being made, so
// that its requests are answered unavailable ("being placed", retry)
// rather than relayed to a host that does not have it yet: a placement
// written pending (a group's, until its members are up), or a managed one
// whose share every linked host of it has yet to make (no instance of it
// journaled). A deployment is placed with one command, its shares in it
// (createPlaced): the hosts' journals say when it can be routed, on every
// server, without a second command. With no host of it linked the relay
// answers as before (host_unreachable).
func (s *Server) placing(p *Placement) bool {
	if p.Pending {
		return true
	}
	if !p.Managed() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	linked := false
	for _, hs := range p.Hosts {
		h := s.hosts[hs.Host]
		if h == nil || h.linkCancel == nil {
			continue
		}
		if h.made[p.Deployment] > 0 {
			return false
		}
		linked = true
	}
	return linked
}

// madeWait bounds a request's wait for its deployment's hosts to make
// their shares (awaitMade): a host makes one in milliseconds, and moves a
// refused one on in about as long. Server.madeWait overrides it (tests).
const madeWait = 5 * time.Second

// awaitMade waits, on the hosts' journals and the state's change signal,
// while model's placement p is being made by its hosts (placing, not a
// pending group's), at most madeWait or until ctx ends, and returns the
// placement that serves model then (false when none does any more: its
// placement was taken back). A request for a deployment just placed
// waits for it, as on a host a request waits for a starting instance:
// the deploy's answer comes with its host's verdict, and a host's
// journal may reach a server a moment after.
func (s *Server) awaitMade(ctx context.Context, model string, p *Placement) (*Placement, bool) {
	if p.Pending || !s.placing(p) {
		return p, true
	}
	wait := madeWait
	if d := time.Duration(s.madeWait.Load()); d > 0 {
		wait = d
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	s.madeWaits.Add(1)
	defer s.madeWaits.Add(-1)
	for {
		journaled, changed := s.journaled.changed(), s.State.Changed()
		now, ok := s.State.RouteOwner(model)
		if !ok {
			return nil, false
		}
		if p = now; p.Pending || !s.placing(p) {
			return p, true
		}
		select {
		case <-ctx.Done():
			return p, true
		case <-journaled:
		case <-changed:
		}
	}
}

// setJournals replaces a host's journals (its link came up with them);
// the caller holds s.mu.
func (h *liveHost) setJournals(js []*hostv1.InstanceJournal) {
	h.journals, h.made = map[string]*hostv1.InstanceJournal{}, map[string]int{}
	for _, j := range js {
		h.putJournal(j)
	}
}

// putJournal records an instance's journal; the caller holds s.mu.
func (h *liveHost) putJournal(j *hostv1.InstanceJournal) {
	if h.journals == nil {
		h.setJournals(nil)
	}
	h.dropJournal(j.GetInstanceId())
	h.journals[j.GetInstanceId()] = j
	h.made[j.GetDeployment()]++
}

// dropJournal forgets an instance's journal; the caller holds s.mu.
func (h *liveHost) dropJournal(id string) {
	old, had := h.journals[id]
	if !had {
		return
	}
	delete(h.journals, id)
	if h.made[old.GetDeployment()]--; h.made[old.GetDeployment()] <= 0 {
		delete(h.made, old.GetDeployment())
	}
}

// admitWait bounds the wait for a host's ledger to admit a new start; one
// still undecided then is taken as admitted (its status tells the rest).
const admitWait = 30 * time.Second

// capacityCodes are the refusals that send a share to the next host.
var capacityCodes = map[structs.Code]bool{
	structs.CodeCapacityBlocked: true, structs.CodeInsufficientDevice: true, structs.CodeInsufficientMemory: true,
	structs.CodeStartupNeedsEmptyHost: true, structs.CodeHostBackedUnavailable: true, structs.CodeInsufficientResources: true,
	structs.CodeEngineNotFound: true, structs.CodeHostUnreachable: true,
}

// schedHosts is every joined host as the scheduler sees it.
func (s *Server) schedHosts() []scheduler.Host {
	var out []scheduler.Host
	for _, rec := range s.State.Hosts() {
		free, ready := s.readiness(rec.Name)
		out = append(out, scheduler.Host{Name: rec.Name, Free: free, Ready: ready, Draining: rec.Drained})
	}
	return out
}

// candidates are the hosts that take placements now (placement.hosts
// narrows them), most free card memory first.
func (s *Server) candidates(ps *structs.PlacementSpec) []scheduler.Host {
	var allowed []string
	if ps != nil {
		allowed = ps.Hosts
	}
	return scheduler.Candidates(s.schedHosts(), allowed)
}

func toShares(ss []scheduler.Share) []HostShare {
	out := make([]HostShare, 0, len(ss))
	for _, s := range ss {
		out = append(out, HostShare{Host: s.Host, Instances: s.Instances})
	}
	return out
}

func fromShares(hs []HostShare) []scheduler.Share {
	out := make([]scheduler.Share, 0, len(hs))
	for _, h := range hs {
		out = append(out, scheduler.Share{Host: h.Host, Instances: h.Instances})
	}
	return out
}

// commitPlacement writes p in place of the version expect (0: a new
// one); p takes its new version. It returns the index of the change: the
// hosts' answers to it are awaited at that index (a later one may not
// touch their shares, and would never be answered).
func (s *Server) commitPlacement(p *Placement, expect uint64) (uint64, error) {
	var version uint64
	index, err := s.applyIndexed(fsm.Placed{Placement: p, Checked: true, Expect: expect}, &version)
	if err != nil {
		return 0, err
	}
	p.Version = version
	return index, nil
}

// hostSpec is a deployment's spec as one host runs it: its share of the
// instances, without the server's placement block.
func hostSpec(raw json.RawMessage, instances int) ([]byte, error) {
	var dep map[string]any
	if err := json.Unmarshal(raw, &dep); err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the deployment is not a JSON object: %v", err)
	}
	dep["instances"] = instances
	delete(dep, "placement")
	return json.Marshal(dep)
}

// desiredDeployments are the deployments placed on host, as its share
// says them.
func (s *Server) desiredDeployments(host string) []*hostv1.DesiredDeployment {
	var out []*hostv1.DesiredDeployment
	for _, p := range s.State.PlacementsOn(host) {
		if !p.Managed() {
			continue
		}
		for _, hs := range p.Hosts {
			if hs.Host != host {
				continue
			}
			spec, err := hostSpec(p.Spec, hs.Instances)
			if err != nil {
				s.logger.Warn("a placed deployment's spec does not decode", "deployment", p.Deployment, "error", err)
				continue
			}
			out = append(out, &hostv1.DesiredDeployment{Name: p.Deployment, Revision: p.Revision, SpecJson: spec, Desired: p.Desired, Evict: p.Evict,
				Starts: p.Starts})
		}
	}
	return out
}

// verdict is a host's answer to its share of a deployment: nil when its
// instances were made (and, when asked, admitted by its ledger); started
// is when the host began the share (host clock): what its instances
// record since is this change's doing.
type verdict struct {
	host    string
	err     error
	started int64
}

// awaitVerdicts waits for each host of shares to answer the share it was
// sent for the change committed at index and, with admit, for its
// ledger's verdict on its instances' start.
func (s *Server) awaitVerdicts(ctx context.Context, dep string, shares []HostShare, index uint64, admit bool) []verdict {
	out := make([]verdict, len(shares))
	done := make(chan struct{}, len(shares))
	for i, hs := range shares {
		go func(i int, hs HostShare) {
			defer func() { done <- struct{}{} }()
			started, err := s.awaitHost(ctx, dep, hs, index, admit)
			out[i] = verdict{host: hs.Host, err: err, started: started}
		}(i, hs)
	}
	for range shares {
		<-done
	}
	return out
}

// awaitHost is one host's verdict (awaitVerdicts), and when it began the
// share.
func (s *Server) awaitHost(ctx context.Context, dep string, hs HostShare, index uint64, admit bool) (int64, error) {
	a, err := s.waitApplied(ctx, hs.Host, index)
	if err != nil {
		return 0, err
	}
	acted := actedAt(a, dep)
	if e := resultOf(a, "deployment", dep); e != nil {
		return acted, e.WithDetail("host", hs.Host)
	}
	if !admit {
		return acted, nil
	}
	actx, cancel := context.WithTimeout(ctx, admitWait)
	defer cancel()
	return acted, s.waitAdmission(actx, hs.Host, dep, hs.Instances, acted)
}

// waitAdmission waits on the host's change signal until its ledger
// admitted every one of want instances of dep (starting with a ledger
// phase, charged, or ready) or refused one since the host began the share
// (since, host clock): that refusal is returned. An undecided start at the
// end of ctx counts as admitted (its status tells the rest).
func (s *Server) waitAdmission(ctx context.Context, host, dep string, want int, since int64) error {
	for {
		s.mu.Lock()
		h := s.hosts[host]
		if h == nil || h.linkCancel == nil {
			s.mu.Unlock()
			return structs.Errf(structs.CodeHostUnreachable, "host %s went out of reach", host).WithDetail("host", host)
		}
		ch := h.changed.changed()
		admitted, refusal := admission(h.journals, dep, since)
		s.mu.Unlock()
		switch {
		case refusal != nil:
			return refusal.WithDetail("host", host)
		case admitted >= want:
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
	}
}

// admission reads a host's journals of dep: how many instances its ledger
// admitted, and a refusal recorded since (host clock).
func admission(journals map[string]*hostv1.InstanceJournal, dep string, since int64) (int, *structs.Error) {
	admitted := 0
	for _, j := range journals {
		if j.GetDeployment() != dep {
			continue
		}
		st := structs.InstanceState(j.GetState())
		moving := st == structs.StateStarting || st == structs.StateWaking
		switch {
		case st == structs.StateReady || (moving && (j.GetPhase() != "" || len(j.GetCharges()) > 0)):
			admitted++
		case !moving && j.GetErrorCode() != "" && j.GetErrorUnixMs() >= since:
			// Refused since the share: a stopped instance that could not
			// start, a parked one that could not wake.
			return admitted, structs.Errf(structs.Code(j.GetErrorCode()), "%s", j.GetErrorMessage())
		}
	}
	return admitted, nil
}

// refusalOf is a refusal as the deploy's details list it.
func refusalOf(err error) map[string]any {
	e := structs.AsError(err)
	return map[string]any{"code": string(e.Code), "message": strings.TrimPrefix(e.Message, "host "), "details": e.Details}
}

// actedAt is when a host last acted on dep (its answer's result for it;
// when the answer has none, when the host began the share).
func actedAt(a *hostv1.DesiredApplied, dep string) int64 {
	for _, r := range a.GetResults() {
		if r.GetKind() == "deployment" && r.GetName() == dep && r.GetActedUnixMs() > 0 {
			return r.GetActedUnixMs()
		}
	}
	return a.GetStartedUnixMs()
}
