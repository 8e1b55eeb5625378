// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// Groups: one model across several machines. The server places one member
// per host of placement.hosts, rank in list order (the first host runs the
// head, rank 0, which serves the engine's API). Each member is an ordinary
// deployment of the same name on its host, with the group's facts in its
// spec (structs.GroupMember), which the host runs from its share of the
// desired state (groupdesired.go): the host's own ledger admits it, its
// own driver plans its rank, its own lifecycle runs and journals it. What
// no single host can do is the server's, here: the order of bring-up, park
// and wake across hosts; stopping the whole group when one member fails or
// the bring-up stalls; routing to the head only; and never letting a host
// start, park, evict or retry a member on its own (core/lifecycle refuses
// those for members).

// DefaultGroupStallTimeout bounds a group's bring-up (group_stall_timeout).
const DefaultGroupStallTimeout = 120 * time.Second

// memberHostReady refuses a group whose host cannot take a member now.
func (s *Server) memberHostReady(host, dep string) error {
	rec, ok := s.State.Host(host)
	switch {
	case !ok:
		return structs.Errf(structs.CodeNotFound, "group %s names host %s, which has not joined (capyctl list hosts)", dep, host).WithDetail("host", host)
	case rec.Drained:
		return structs.Errf(structs.CodeHostDraining, "group %s names host %s, which is draining: capyctl drain host %s --resume", dep, host, host).WithDetail("host", host)
	}
	if !s.hostIO.reachable(host) {
		e := structs.Errf(structs.CodeHostUnreachable, "group %s names host %s, which is out of reach of the server: every member's host must be connected", dep, host).WithDetail("host", host)
		e.RetryAfter = int(2*s.o.Heartbeat.Seconds()) + 1
		return e
	}
	return nil
}

// withMember names the member a refusal is about.
func withMember(err error, host string, rank int) error {
	e := structs.AsError(err)
	out := &structs.Error{Code: e.Code, RetryAfter: e.RetryAfter, Cause: e,
		Message: fmt.Sprintf("group member rank %d on host %s: %s", rank, host, strings.TrimPrefix(e.Message, "host "+host+": "))}
	for k, v := range e.Details {
		out = out.WithDetail(k, v)
	}
	return out.WithDetail("host", host).WithDetail("rank", rank)
}

// createGroup places a group through the desired state: its name and
// routes reserved with the head's share (placeMembers writes the rest);
// any refusal takes the whole group back (each host deletes what it made
// of it) and refuses the deploy, naming the member.
func (s *Server) createGroup(ctx context.Context, spec *structs.Deployment, raw json.RawMessage, activate bool) (*wire.DeploymentStatus, error) {
	hosts := spec.Placement.Hosts
	for _, h := range hosts {
		if err := s.memberHostReady(h, spec.Name); err != nil {
			return nil, err
		}
	}
	desired := structs.DesiredOnDemand
	if activate {
		desired = structs.DesiredRunning
	}
	g := &GroupPlacement{ID: newAttempt(), Hosts: hosts, TensorParallel: spec.Topology.TensorParallel, PipelineParallel: spec.Topology.PipelineParallel}
	p := &Placement{Deployment: spec.Name, Routes: spec.Routes, Revision: 1, At: time.Now().UTC(), Spec: raw, Group: g, Pending: true}
	for _, h := range hosts {
		p.Hosts = append(p.Hosts, HostShare{Host: h, Instances: 1})
		g.Ranks = append(g.Ranks, RankDesired{Desired: desired})
	}
	// IMPORTANT: not detach (as createPlaced): a bring-up that ends early
	// is taken back, which must never race a retry's placement.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), placeWait)
	defer cancel()
	s.groups.setPlacing(g.ID, true) // before the commit: never taken back as an earlier leader's
	defer s.groups.setPlacing(g.ID, false)
	index, err := s.commitPlacement(p, 0)
	if err != nil {
		return nil, err
	}
	if err := s.placeMembers(ctx, p, index, activate); err != nil {
		if uerr := s.unplaceGroup(ctx, p); uerr != nil {
			s.logger.Warn("take back a group no host took whole", "deployment", p.Deployment, "error", uerr)
		}
		return nil, err
	}
	p.Pending = false
	if _, err := s.commitPlacement(p, p.Version); err != nil {
		return nil, err
	}
	s.groups.setErr(spec.Name, nil)
	s.event("group_placed", hosts[0], map[string]any{"deployment": spec.Name, "hosts": hosts,
		"rendezvous": fmt.Sprintf("%s:%d", g.HeadAddress, g.RendezvousPort)})
	if activate {
		s.goRun(func() { s.watchBringUp(spec.Name, g.ID) })
	}
	st := s.deploymentStatus(ctx, p)
	return &st, nil
}

// placeMembers brings a new group's members up in rank order: the head's
// share first (committed at index: its host picks the rendezvous port and
// answers it; with activate its ledger admits the head), then the
// workers' with the head's address, each admitted by its host's ledger.
// A refusal names the member.
func (s *Server) placeMembers(ctx context.Context, p *Placement, index uint64, activate bool) error {
	g := p.Group
	a, err := s.awaitMember(ctx, p, 0, index, activate)
	if err == nil {
		err = headAddress(a, p)
	}
	if err != nil {
		return withMember(err, g.Hosts[0], 0)
	}
	if index, err = s.commitPlacement(p, p.Version); err != nil {
		return err
	}
	workers := make([]int, 0, len(g.Hosts)-1)
	changed := make([]bool, len(g.Hosts))
	for r := 1; r < len(g.Hosts); r++ {
		workers, changed[r] = append(workers, r), true
	}
	for _, f := range s.awaitRanks(ctx, p, workers, index, changed, activate) {
		return withMember(f.err, g.Hosts[f.rank], f.rank)
	}
	return nil
}

// member is what the server knows of one member now.
type member struct {
	host      string
	rank      int
	state     string
	since     time.Time
	phase     string
	resid     string
	desired   string
	lastErr   *structs.ErrorRecord
	reason    string
	reachable bool
}

// members is every member as its host's journals last said (a host out
// of reach reads uncertain). The journals cannot lag an answer the server
// waited for: a host sends a command's result and its answer to a share
// only after the journals of the record writes before them
// (hostagent/hostlink.go), and the group's operations run under its lock,
// so what the last one waited for is in. What a host does on its own (an
// engine that exits, a start's progress) may still be on its way, as it
// was for a read over the relay a moment earlier; the supervisor acts on
// it when it comes.
func (s *Server) members(name string, g *GroupPlacement) []member {
	out := make([]member, len(g.Hosts))
	for rank, host := range g.Hosts {
		out[rank] = s.memberJournal(host, rank, name)
	}
	return out
}

// memberOf reads a member's status from its host over the relay: where
// the host's own answer decides (relay.go: after the head's host answered
// a request 503 over the relay, a connection the journals do not share,
// so its journal may be older than that answer).
func (s *Server) memberOf(ctx context.Context, host string, rank int, name string) member {
	m := member{host: host, rank: rank, state: stateUncertain}
	status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(name), nil, nil)
	var st wire.DeploymentStatus
	if err != nil || status != http.StatusOK || json.Unmarshal(data, &st) != nil || len(st.Instances) == 0 {
		if err == nil && status == http.StatusNotFound {
			m.state, m.reachable = string(structs.StateStopped), true
		}
		return m
	}
	in := st.Instances[0]
	m.state, m.since, m.phase, m.resid, m.desired, m.lastErr, m.reachable = in.State, in.Since, in.Phase, in.Residency, st.Desired, in.LastError, true
	m.reason = in.Reason
	return m
}

// memberAction runs one action on a deployment's host, bounded by d.
func (s *Server) memberAction(ctx context.Context, d time.Duration, host, name string, req wire.ActionRequest) error {
	body, _ := json.Marshal(req)
	status, data, err := s.hostCallWithin(ctx, d, host, http.MethodPost, "/deployments/"+url.PathEscape(name)+"/actions",
		http.Header{"Content-Type": {"application/json"}}, body)
	if err == nil && status >= 300 {
		err = hostError(host, status, data)
	}
	return err
}

// memberCommand parks or wakes a member: a typed command on its host's
// link (the leader's term, run once), waited for, bounded by
// groupCallTimeout.
func (s *Server) memberCommand(ctx context.Context, host, name, action string, evict bool) error {
	ctx, cancel := context.WithTimeout(ctx, groupCallTimeout)
	defer cancel()
	a := &hostv1.DeploymentAction{Deployment: name, Action: action, Instance: -1, Wait: true}
	if action == wire.ActionStart {
		a.Instance, a.Evict = 0, evict // a parked member's start wakes it
	}
	return s.hostIO.command(ctx, host, a)
}

// groupCallTimeout bounds one member's park or wake (a wake reloads the
// weights) and a member's stop.
const groupCallTimeout = 10 * time.Minute

// callWait runs an action with wait on a deployment a host made itself
// (adopted): the call's bound is a group's, since a group in the way may
// be parked first.
func (s *Server) callWait(ctx context.Context, host, name, action string, evict bool) error {
	return s.memberAction(ctx, groupCallTimeout, host, name, wire.ActionRequest{Action: action, Wait: true, Evict: evict})
}

// groupStart starts or wakes a whole group. A parked group wakes workers
// first (each host's ledger admits its member's ready charge; a worker has
// nothing to wake itself), then the head, whose wake acts on every rank and
// answers the wake check. A stopped group starts the head first, then the
// workers, each admitted by its host's ledger before the next, and is ready
// when the head passes readiness (bounded by group_stall_timeout). With
// evict, a host that has no room for a member may evict its idle models
// (as a request's activation does); with groups too, an operator's
// --evict, it may also park or stop another group in the way.
func (s *Server) groupStart(ctx context.Context, p *Placement, evict, groups bool) error {
	if err := earlierGroup(p); err != nil {
		return err
	}
	l := s.groups.lock(p.Deployment)
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	return s.groupStartLocked(ctx, p, evict, groups)
}

// groupStartLocked is groupStart with the group's lock held.
func (s *Server) groupStartLocked(ctx context.Context, p *Placement, evict, groups bool) (err error) {
	g := p.Group
	defer func() {
		// The group's own verdict, for whoever waits on its status (a
		// member's record says only its part, and may be retried).
		if err != nil && ctx.Err() == nil {
			if cur := s.groups.err(p.Deployment); cur == nil || time.Since(cur.At) > time.Second {
				e := structs.AsError(err)
				s.groups.setErr(p.Deployment, &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: time.Now().UTC()})
			}
		}
	}()
	ms := s.members(p.Deployment, g)
	if err := uncertain(p.Deployment, ms); err != nil {
		return err
	}
	// Failures recorded before this start belong to the group's last run:
	// the supervisor must not stop this one for them.
	s.markSeen(p.Deployment, ms)
	head := ms[0]
	switch head.state {
	case string(structs.StateReady):
		s.groups.setDown(p.Deployment, false)
		return nil
	case string(structs.StateParked):
		if err := s.groupWake(ctx, p, ms, evict, groups); err != nil {
			return err
		}
		s.groups.setDown(p.Deployment, false)
		return nil
	}
	// A cold start: every member stopped first (a failed member's launch
	// record cleared), then the head, admitted by its host's ledger, then
	// the workers.
	if err := s.stopMembers(ctx, p.Deployment, g); err != nil {
		return err
	}
	s.groups.setErr(p.Deployment, nil)
	workers := make([]int, 0, len(g.Hosts)-1)
	for r := 1; r < len(g.Hosts); r++ {
		workers = append(workers, r)
	}
	for _, ranks := range [][]int{{0}, workers} {
		if err := s.startRanks(ctx, p, ranks, evict, groups); err != nil {
			_ = s.stopMembers(ctx, p.Deployment, g)
			return err
		}
	}
	if err := s.waitHeadReady(ctx, p.Deployment, g); err != nil {
		return err
	}
	s.groups.setDown(p.Deployment, false)
	return nil
}

// groupWake wakes a parked group: workers first, then the head.
func (s *Server) groupWake(ctx context.Context, p *Placement, ms []member, evict, groups bool) error {
	g := p.Group
	var woken []int
	wake := func(rank int) error {
		for try := 0; ; try++ {
			err := s.memberCommand(ctx, g.Hosts[rank], p.Deployment, wire.ActionStart, evict)
			if err == nil || try > 0 || !groups || !s.evictGroups(ctx, p.Deployment, s.withGroupsOn(err, g.Hosts[rank], p.Deployment)) {
				return err
			}
		}
	}
	for rank := 1; rank < len(g.Hosts); rank++ {
		if ms[rank].state == string(structs.StateReady) {
			continue
		}
		if err := wake(rank); err != nil {
			// Nothing woke on the engines yet: the woken workers park again
			// (their ranks never left their parked state).
			for _, r := range woken {
				_ = s.memberCommand(ctx, g.Hosts[r], p.Deployment, wire.ActionPark, false)
			}
			return withMember(err, g.Hosts[rank], rank)
		}
		woken = append(woken, rank)
	}
	if err := wake(0); err != nil {
		e := structs.AsError(err)
		code := structs.CodeGroupMemberFailed
		if e.Code == structs.CodeWakeMismatch {
			code = structs.CodeGroupWakeMismatch
		}
		s.failGroup(ctx, p.Deployment, g, code, "the head's wake failed: "+e.Message)
		return withMember(err, g.Hosts[0], 0)
	}
	return nil
}

// groupPark parks a ready group: the head first (its sleep acts on every
// rank), then each worker, whose host proves its rank released its memory.
// A group that cannot park (restart only) stops; a member whose park fails
// stops the whole group.
func (s *Server) groupPark(ctx context.Context, p *Placement) error {
	l := s.groups.lock(p.Deployment)
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	return s.groupParkLocked(ctx, p)
}

func (s *Server) groupParkLocked(ctx context.Context, p *Placement) error {
	g := p.Group
	if err := earlierGroup(p); err != nil {
		return err
	}
	s.groups.setDown(p.Deployment, true)
	ms := s.members(p.Deployment, g)
	if err := uncertain(p.Deployment, ms); err != nil {
		return err
	}
	head := ms[0]
	switch {
	case head.state == string(structs.StateParked):
		return nil
	case head.state != string(structs.StateReady):
		return structs.Errf(structs.CodeConflict, "group %s is %s, not ready", p.Deployment, head.state)
	case head.resid == structs.ResidencyRestartOnly || head.resid == "":
		return s.stopMembers(ctx, p.Deployment, g)
	}
	for rank, host := range g.Hosts {
		if err := s.memberCommand(ctx, host, p.Deployment, wire.ActionPark, false); err != nil {
			s.failGroup(ctx, p.Deployment, g, structs.CodeParkFailed, fmt.Sprintf("rank %d on host %s: %s", rank, host, structs.AsError(err).Message))
			return withMember(err, host, rank)
		}
	}
	return nil
}

// uncertain refuses an operation while a member's host is out of reach.
func uncertain(name string, ms []member) error {
	for _, m := range ms {
		if !m.reachable {
			e := structs.Errf(structs.CodeGroupMemberUncertain,
				"group %s: the member on host %s (rank %d) is uncertain, its host agent out of reach; its charge is kept until the agent is back", name, m.host, m.rank).
				WithDetail("host", m.host).WithDetail("rank", m.rank)
			e.RetryAfter = 2
			return e
		}
	}
	return nil
}

// groupStop stops a group on every host.
func (s *Server) groupStop(ctx context.Context, p *Placement) error {
	s.groups.askStop(p.Deployment) // a bring-up under way gives way
	l := s.groups.lock(p.Deployment)
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	return s.stopMembers(ctx, p.Deployment, p.Group)
}

// waitHeadReady waits for the head's readiness within the stall timeout,
// reading the members' journals at each change of their hosts (a journal,
// a link up or down) or an operator's stop; a member that failed stops
// the group (group_member_failed), a stalled bring-up too
// (group_stalled).
func (s *Server) waitHeadReady(ctx context.Context, name string, g *GroupPlacement) error {
	deadline := time.Now().Add(s.o.GroupStallTimeout)
	stall := time.NewTimer(s.o.GroupStallTimeout)
	defer stall.Stop()
	stops := s.groups.stopAsked(name)
	for {
		changes := s.hostIO.changes(g.Hosts, s.groups.stopped.changed())
		if s.groups.stopAsked(name) != stops {
			return structs.Errf(structs.CodeActivationFailed, "group %s: an operator stopped it before it was ready", name)
		}
		ms := make([]member, len(g.Hosts))
		for rank, host := range g.Hosts {
			ms[rank] = s.memberJournal(host, rank, name)
		}
		if ms[0].state == string(structs.StateReady) {
			return nil
		}
		for _, m := range ms {
			if m.reachable && memberFailed(m.state, m.reason) && s.groups.firstSight(name, m.host, m.since.UnixMilli()) {
				msg := fmt.Sprintf("rank %d on host %s failed during bring-up", m.rank, m.host)
				if m.lastErr != nil {
					msg += ": " + m.lastErr.Message
				}
				s.failGroup(ctx, name, g, structs.CodeGroupMemberFailed, msg)
				return structs.Errf(structs.CodeGroupMemberFailed, "group %s: %s; the group was stopped", name, msg).WithDetail("host", m.host).WithDetail("rank", m.rank)
			}
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("the head on %s was not ready within group_stall_timeout (%s); members: %s", g.Hosts[0], s.o.GroupStallTimeout, describeMembers(ms))
			s.failGroup(ctx, name, g, structs.CodeGroupStalled, msg)
			return structs.Errf(structs.CodeGroupStalled, "group %s: %s; the group was stopped", name, msg)
		}
		// Past the stall deadline the next turn fails the group.
		if _, err := changes.wait(ctx, stall.C); err != nil {
			return err
		}
	}
}

func describeMembers(ms []member) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("rank %d %s %s", m.rank, m.host, m.state))
	}
	return strings.Join(parts, ", ")
}
