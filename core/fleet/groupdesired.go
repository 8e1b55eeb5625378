// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// A group's members are desired state, as a single deployment's
// instances are: the group's placement carries the operator's spec and
// each rank's desired state (GroupPlacement.Ranks), written through raft;
// each host receives its member's share with the rest of its share (the
// spec with one instance and the member's facts: rank, size, hosts, the
// head's rendezvous address) and reconciles it with its own lifecycle and
// ledger, as for a single deployment (core/agent/desired.go). The server
// orders a group across its hosts by what it writes, and when: the head's
// share first (its host picks the rendezvous port and answers it), the
// workers' once the head's address is written; a cold start writes the
// head running, waits for its ledger's verdict, then the workers; a stop
// writes every rank stopped. Its waits wait on the hosts' answers and
// journals (change signals), never on a timer. Park and wake are still
// management calls to each member's host (groupPark, groupWake).

// memberSpec is a member's spec as its host runs it: the deployment as
// the operator wrote it, with one instance, the member's facts, and no
// warm start (a host never starts a member on its own). IMPORTANT: a
// head's share never carries the rendezvous address: its host picks it,
// and a share that changed once the address is known would make its host
// deploy the head again.
func memberSpec(raw json.RawMessage, g *GroupPlacement, rank int) ([]byte, error) {
	var dep map[string]any
	if err := json.Unmarshal(raw, &dep); err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the deployment is not a JSON object: %v", err)
	}
	m := structs.GroupMember{ID: g.ID, Rank: rank, Size: len(g.Hosts), Hosts: g.Hosts}
	if rank > 0 {
		m.HeadAddress, m.RendezvousPort = g.HeadAddress, g.RendezvousPort
	}
	dep["instances"] = 1
	dep["group"] = m
	if lc, ok := dep["lifecycle"].(map[string]any); ok {
		lc["warm"] = false
	}
	return json.Marshal(dep)
}

// hasShare reports whether a rank's host is sent its member: the head
// always, a worker once the head's rendezvous address is written (a
// group without a spec is no host's share).
func hasShare(p *Placement, rank int) bool {
	return p.Reconciled() && (rank == 0 || p.Group.HeadAddress != "")
}

// desiredMembers are the group members placed on host, as its share says
// them.
func (s *Server) desiredMembers(host string) []*hostv1.DesiredDeployment {
	var out []*hostv1.DesiredDeployment
	for _, p := range s.State.Placements() {
		if !p.Reconciled() {
			continue
		}
		g := p.Group
		rank := slices.Index(g.Hosts, host)
		if rank < 0 || !hasShare(p, rank) {
			continue
		}
		spec, err := memberSpec(p.Spec, g, rank)
		if err != nil {
			s.logger.Warn("a placed group's spec does not decode", "deployment", p.Deployment, "error", err)
			continue
		}
		rd := g.Ranks[rank]
		out = append(out, &hostv1.DesiredDeployment{Name: p.Deployment, Revision: p.Revision, SpecJson: spec,
			Desired: rd.Desired, Evict: rd.Evict, Starts: rd.Starts})
	}
	return out
}

// earlierGroup refuses to move a group placed by an earlier build (no
// spec in its placement): its hosts run its members as their own.
func earlierGroup(p *Placement) error {
	if p.Reconciled() {
		return nil
	}
	return structs.Errf(structs.CodeUnsupported,
		"group %s was placed by an earlier build, whose hosts do not run it from the desired state: delete it (capyctl delete deployment %s, then on each host capyctl --address HOST delete deployment %s) and deploy it again",
		p.Deployment, p.Deployment, p.Deployment)
}

// setRanks writes the desired state of ranks of group name (placement
// id); a start counts (each rank's host starts its member again, even one
// desired running already). It returns the placement written, the index
// of the change, and the ranks whose share it changed (those whose hosts'
// answer to it is awaited: a share that did not change is not sent
// again).
func (s *Server) setRanks(name, id string, ranks []int, desired string, evict bool) (*Placement, uint64, []bool, error) {
	for try := 0; ; try++ {
		p, ok := s.State.Placement(name)
		if !ok || p.Group == nil || p.Group.ID != id {
			return nil, 0, nil, structs.Errf(structs.CodeNotFound, "group %s was deleted or placed again meanwhile", name)
		}
		if err := earlierGroup(p); err != nil {
			return nil, 0, nil, err
		}
		g := p.Group
		changed := make([]bool, len(g.Hosts))
		write := false
		for _, r := range ranks {
			rd := &g.Ranks[r]
			changes := rd.Desired != desired || desired == structs.DesiredRunning
			changed[r] = changes && hasShare(p, r)
			write = write || changes
			rd.Desired = desired
			if desired == structs.DesiredRunning {
				rd.Starts++
				rd.Evict = evict
			}
		}
		if !write {
			return p, 0, changed, nil
		}
		index, err := s.commitPlacement(p, p.Version)
		if structs.HasCode(err, structs.CodeConflict) && try < 2 {
			continue // changed meanwhile (a placement's other change): written again on the new version
		}
		return p, index, changed, err
	}
}

// awaitMember waits for a member's host to answer its share read at index
// or later (0: its last answer) and, with admit, for its ledger's verdict
// on the member's start. The answer comes back (a head's carries its
// rendezvous address).
func (s *Server) awaitMember(ctx context.Context, p *Placement, rank int, index uint64, admit bool) (*hostv1.DesiredApplied, error) {
	host := p.Group.Hosts[rank]
	a, err := s.hostIO.applied(ctx, host, index)
	if err != nil {
		return nil, err
	}
	if e := resultOf(a, "deployment", p.Deployment); e != nil {
		return a, e.WithDetail("host", host)
	}
	if !admit {
		return a, nil
	}
	actx, cancel := context.WithTimeout(ctx, admitWait)
	defer cancel()
	return a, s.memberAdmitted(actx, host, p.Deployment, actedAt(a, p.Deployment))
}

// memberAdmitted waits on a host's change signal until its ledger
// admitted its member of dep (starting with a ledger phase, or ready) or
// refused it since the host acted on its share (since, host clock): that
// refusal is returned. A start still undecided at the end of ctx counts
// as admitted (the bring-up's wait for the head tells the rest).
func (s *Server) memberAdmitted(ctx context.Context, host, dep string, since int64) error {
	id := structs.InstanceID(dep, 0)
	for {
		changes := s.hostIO.changes([]string{host})
		if !s.hostIO.reachable(host) {
			return structs.Errf(structs.CodeHostUnreachable, "host %s went out of reach", host).WithDetail("host", host)
		}
		admitted, refusal := admission(map[string]*hostv1.InstanceJournal{id: s.hostIO.journal(host, id)}, dep, since)
		switch {
		case refusal != nil:
			return refusal.WithDetail("host", host)
		case admitted > 0:
			return nil
		}
		if _, err := changes.wait(ctx, nil); err != nil {
			return nil
		}
	}
}

// rankErr is one member's refusal.
type rankErr struct {
	rank int
	err  error
}

// awaitRanks waits for each of ranks as awaitMember does (all at once),
// the change committed at index awaited where changed says it touched the
// rank's share; it returns the refusals in rank order.
func (s *Server) awaitRanks(ctx context.Context, p *Placement, ranks []int, index uint64, changed []bool, admit bool) []rankErr {
	errs := make([]error, len(p.Group.Hosts))
	var wg sync.WaitGroup
	for _, r := range ranks {
		idx := index
		if !changed[r] {
			idx = 0
		}
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			_, errs[r] = s.awaitMember(ctx, p, r, idx, admit)
		}(r)
	}
	wg.Wait()
	var out []rankErr
	for r, err := range errs {
		if err != nil {
			out = append(out, rankErr{r, err})
		}
	}
	return out
}

// startRanks writes ranks running (a start each, evict letting their
// hosts make room) and waits for each host's ledger to admit its member.
// A capacity refusal naming another group on the member's host parks
// that group when groups allows, and the refused members start once
// more. The first refusal left names its member.
func (s *Server) startRanks(ctx context.Context, p *Placement, ranks []int, evict, groups bool) error {
	for try := 0; ; try++ {
		cur, index, changed, err := s.setRanks(p.Deployment, p.Group.ID, ranks, structs.DesiredRunning, evict)
		if err != nil {
			return err
		}
		refused := s.awaitRanks(ctx, cur, ranks, index, changed, true)
		if len(refused) == 0 {
			return nil
		}
		first := refused[0]
		host := cur.Group.Hosts[first.rank]
		if try > 0 || !groups || !s.evictGroups(ctx, p.Deployment, s.withGroupsOn(first.err, host, p.Deployment)) {
			return withMember(first.err, host, first.rank)
		}
		ranks = ranks[:0]
		for _, r := range refused {
			ranks = append(ranks, r.rank)
		}
	}
}

// stopMembers writes every member stopped and waits, bounded by
// groupCallTimeout, until each host in reach answered and its member
// stopped (all at once: a rank that loses a peer exits anyway). A host
// out of reach stops its member from its share when it links again.
func (s *Server) stopMembers(ctx context.Context, name string, g *GroupPlacement) error {
	s.groups.setDown(name, true)
	ctx, cancel := context.WithTimeout(ctx, groupCallTimeout)
	defer cancel()
	all := make([]int, len(g.Hosts))
	for r := range all {
		all[r] = r
	}
	p, index, changed, err := s.setRanks(name, g.ID, all, structs.DesiredStopped, false)
	if err != nil {
		return err
	}
	errs := make([]error, len(g.Hosts))
	var wg sync.WaitGroup
	for rank, host := range p.Group.Hosts {
		if !s.hostIO.reachable(host) {
			continue
		}
		idx := index
		if !changed[rank] {
			idx = 0
		}
		wg.Add(1)
		go func(rank int, host string) {
			defer wg.Done()
			if _, errs[rank] = s.awaitMember(ctx, p, rank, idx, false); errs[rank] == nil {
				errs[rank] = s.memberStopped(ctx, host, name)
			}
		}(rank, host)
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			return withMember(err, g.Hosts[rank], rank)
		}
	}
	return nil
}

// memberStopped waits on a host's change signal until its member of dep
// runs nothing (stopped, failed, or no record).
func (s *Server) memberStopped(ctx context.Context, host, dep string) error {
	id := structs.InstanceID(dep, 0)
	for {
		changes := s.hostIO.changes([]string{host})
		if !s.hostIO.reachable(host) {
			return structs.Errf(structs.CodeHostUnreachable, "host %s went out of reach before its member stopped", host).WithDetail("host", host)
		}
		j := s.hostIO.journal(host, id)
		if st := structs.InstanceState(j.GetState()); j == nil || st == structs.StateStopped || st == structs.StateFailed {
			return nil
		}
		if _, err := changes.wait(ctx, nil); err != nil {
			return structs.Errf(structs.CodeHostUnreachable, "host %s did not stop its member within %s", host, groupCallTimeout).WithDetail("host", host)
		}
	}
}

// headAddress takes the rendezvous address the head's host picked from
// its answer.
func headAddress(a *hostv1.DesiredApplied, p *Placement) error {
	for _, r := range a.GetResults() {
		if r.GetKind() == "deployment" && r.GetName() == p.Deployment && r.GetHeadAddress() != "" && r.GetRendezvousPort() != 0 {
			p.Group.HeadAddress, p.Group.RendezvousPort = r.GetHeadAddress(), int(r.GetRendezvousPort())
			return nil
		}
	}
	return structs.Errf(structs.CodeInternal, "host %s answered the group's head without a rendezvous address (an older CapyCTL on the host?)", p.Group.Hosts[0])
}

// unplaceGroup takes a group out of the desired state: each host deletes
// its member from its share (a host out of reach does when it links
// again), and the answer waits for the hosts in reach that had one.
func (s *Server) unplaceGroup(ctx context.Context, p *Placement) error {
	index, err := s.applyIndexed(fsm.Unplaced{Deployment: p.Deployment}, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), placeWait)
	defer cancel()
	for rank, host := range p.Group.Hosts {
		if !hasShare(p, rank) || !s.hostIO.reachable(host) {
			continue
		}
		a, err := s.hostIO.applied(ctx, host, index)
		if err != nil {
			s.logger.Info("a deleted group's host went out of reach: it deletes its member when it links again", "deployment", p.Deployment, "host", host)
			continue
		}
		if e := resultOf(a, "deployment", p.Deployment); e != nil {
			return withMember(e.WithDetail("host", host), host, rank)
		}
	}
	return nil
}

// memberJournal is what a member's host last journalled of it (uncertain
// while the host is out of reach; stopped when it has no record).
func (s *Server) memberJournal(host string, rank int, name string) member {
	m := member{host: host, rank: rank, state: stateUncertain}
	if !s.hostIO.reachable(host) {
		return m
	}
	m.reachable, m.state = true, string(structs.StateStopped)
	j := s.hostIO.journal(host, structs.InstanceID(name, 0))
	if j == nil {
		return m
	}
	m.state, m.since, m.phase, m.reason, m.resid = j.GetState(), time.UnixMilli(j.GetSinceUnixMs()), j.GetPhase(), j.GetWhy(), j.GetResidency()
	if j.GetErrorCode() != "" {
		m.lastErr = &structs.ErrorRecord{Code: structs.Code(j.GetErrorCode()), Message: j.GetErrorMessage(), At: time.UnixMilli(j.GetErrorUnixMs())}
	} else if j.GetMessage() != "" && memberFailed(m.state, m.reason) {
		m.lastErr = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: j.GetMessage()}
	}
	return m
}
