// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// Groups: one model across several machines. The server places one member
// per host of placement.hosts, rank in list order (the first host runs the
// head, rank 0, which serves the engine's API). Each member is an ordinary
// deployment of the same name on its host, with the group's facts in its
// spec (structs.GroupMember): the host's own ledger admits its share, its
// own driver plans its rank, its own lifecycle runs and journals it. What
// no single host can do is the server's, here: the order of bring-up, park
// and wake across hosts; stopping the whole group when one member fails or
// the bring-up stalls; routing to the head only; and never letting a host
// start, park, evict or retry a member on its own (core/lifecycle refuses
// those for members).

// DefaultGroupStallTimeout bounds a group's bring-up (group_stall_timeout).
const DefaultGroupStallTimeout = 120 * time.Second

// memberBody is a member's deploy body: the deployment as the operator
// wrote it, with one instance, the member's facts, and no warm start (a
// host never starts a member on its own).
func memberBody(depJSON json.RawMessage, m structs.GroupMember, activate bool) ([]byte, error) {
	var dep map[string]any
	if err := json.Unmarshal(depJSON, &dep); err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the deployment is not a JSON object: %v", err)
	}
	dep["instances"] = 1
	dep["group"] = m
	if lc, ok := dep["lifecycle"].(map[string]any); ok {
		lc["warm"] = false
	}
	return json.Marshal(map[string]any{"deployment": dep, "activate": activate})
}

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

// createGroup places a group: the head first (its host picks the
// rendezvous port), then each worker with the head's address; with
// activate each member's ledger admits its share before the next member
// is made. Any refusal removes the members made and refuses the deploy,
// naming the member.
func (s *Server) createGroup(ctx context.Context, hdr http.Header, spec *structs.Deployment, depJSON json.RawMessage, activate bool) (*wire.DeploymentStatus, error) {
	hosts := spec.Placement.Hosts
	for _, h := range hosts {
		if err := s.memberHostReady(h, spec.Name); err != nil {
			return nil, err
		}
	}
	attempt := newAttempt()
	g := &GroupPlacement{ID: attempt, Hosts: hosts, TensorParallel: spec.Topology.TensorParallel, PipelineParallel: spec.Topology.PipelineParallel}
	var made []HostShare
	for rank, host := range hosts {
		m := structs.GroupMember{ID: attempt, Rank: rank, Size: len(hosts), Hosts: hosts, HeadAddress: g.HeadAddress, RendezvousPort: g.RendezvousPort}
		body, err := memberBody(depJSON, m, activate)
		if err != nil {
			return nil, err
		}
		h := hdr.Clone()
		if k := h.Get(wire.HeaderIdempotencyKey); k != "" {
			h.Set(wire.HeaderIdempotencyKey, k+"#"+attempt)
		}
		status, data, err := s.hostCall(ctx, host, http.MethodPost, "/deployments", h, body)
		if err == nil && status >= 300 {
			err = hostError(host, status, data)
		}
		if err == nil && activate {
			err = s.waitAdmitted(ctx, host, spec.Name)
		}
		if err == nil && rank == 0 {
			err = s.readHead(ctx, host, spec.Name, g)
		}
		if err != nil {
			if structs.CodeOf(err) != structs.CodeConflict {
				_, _, _ = s.hostCall(ctx, host, http.MethodDelete, "/deployments/"+url.PathEscape(spec.Name), nil, nil)
			}
			s.rollback(ctx, spec.Name, made)
			return nil, withMember(err, host, rank)
		}
		made = append(made, HostShare{Host: host, Instances: 1})
	}
	p := &Placement{Deployment: spec.Name, Hosts: made, Routes: spec.Routes, Revision: 1, At: time.Now().UTC(), Group: g}
	if err := s.apply(fsm.Placed{Placement: p}); err != nil {
		s.rollback(ctx, spec.Name, made)
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

// readHead reads the head's rendezvous address from its host's record.
func (s *Server) readHead(ctx context.Context, host, name string, g *GroupPlacement) error {
	status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(name), nil, nil)
	if err != nil {
		return err
	}
	var st wire.DeploymentStatus
	if status != http.StatusOK || json.Unmarshal(data, &st) != nil {
		return hostError(host, status, data)
	}
	if st.Spec == nil || st.Spec.Group == nil || st.Spec.Group.RendezvousPort == 0 || st.Spec.Group.HeadAddress == "" {
		return structs.Errf(structs.CodeInternal, "host %s recorded the group head without a rendezvous address (an older CapyCTL on the host?)", host)
	}
	g.HeadAddress, g.RendezvousPort = st.Spec.Group.HeadAddress, st.Spec.Group.RendezvousPort
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

// members reads every member's status from its host (a host out of reach
// reads uncertain).
func (s *Server) members(ctx context.Context, name string, g *GroupPlacement) []member {
	out := make([]member, len(g.Hosts))
	var wg sync.WaitGroup
	for rank, host := range g.Hosts {
		wg.Add(1)
		go func(rank int, host string) {
			defer wg.Done()
			out[rank] = s.memberOf(ctx, host, rank, name)
		}(rank, host)
	}
	wg.Wait()
	return out
}

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

// memberAction runs one action on a member's host, bounded by d.
func (s *Server) memberAction(ctx context.Context, d time.Duration, host, name string, req wire.ActionRequest) error {
	body, _ := json.Marshal(req)
	status, data, err := s.hostCallWithin(ctx, d, host, http.MethodPost, "/deployments/"+url.PathEscape(name)+"/actions",
		http.Header{"Content-Type": {"application/json"}}, body)
	if err == nil && status >= 300 {
		err = hostError(host, status, data)
	}
	return err
}

// groupCallTimeout bounds one member's park or wake (a wake reloads the
// weights) and a member's stop.
const groupCallTimeout = 10 * time.Minute

// callWait runs an action with wait on a member: the call's bound is the
// group's, not a quick management call's.
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
func (s *Server) groupStart(ctx context.Context, p *Placement, evict, groups bool) (err error) {
	g := p.Group
	l := s.groups.lock(p.Deployment)
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
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
	ms := s.members(ctx, p.Deployment, g)
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
	// record cleared).
	if err := s.stopMembers(ctx, p.Deployment, g, ms); err != nil {
		return err
	}
	s.groups.setErr(p.Deployment, nil)
	for rank, host := range g.Hosts {
		before := s.memberOf(ctx, host, rank, p.Deployment)
		err := s.startMember(ctx, host, p.Deployment, evict, groups, before)
		if err != nil {
			_ = s.stopMembers(ctx, p.Deployment, g, nil)
			return withMember(err, host, rank)
		}
	}
	if err := s.waitHeadReady(ctx, p.Deployment, g); err != nil {
		return err
	}
	s.groups.setDown(p.Deployment, false)
	return nil
}

// startMember starts one stopped member without waiting for its readiness
// (a head is ready only once every rank joined) and waits for its host's
// ledger to admit it; a capacity refusal naming another group on the host
// parks that group when evict allows, then tries once more.
func (s *Server) startMember(ctx context.Context, host, name string, evict, groups bool, before member) error {
	for try := 0; ; try++ {
		err := s.memberAction(ctx, hostCallTimeout, host, name, wire.ActionRequest{Action: wire.ActionStart, Evict: evict})
		if err == nil {
			err = s.waitStarted(ctx, host, name, before)
		}
		if err == nil || try > 0 || !groups || !s.evictGroups(ctx, name, s.withGroupsOn(err, host, name)) {
			return err
		}
		before = s.memberOf(ctx, host, 0, name)
	}
}

// waitStarted waits until a member left the state it had before its start
// and its host's ledger admitted it (starting with a ledger phase, or
// ready), or refused it (stopped or failed again, with the error).
func (s *Server) waitStarted(ctx context.Context, host, name string, before member) error {
	deadline := time.NewTimer(admitWait)
	defer deadline.Stop()
	for {
		changes := s.hostIO.changes([]string{host})
		m := s.memberOf(ctx, host, 0, name)
		// A start refused before it changed the state (no room) records
		// only a newer last error.
		newErr := m.lastErr != nil && (before.lastErr == nil || m.lastErr.At.After(before.lastErr.At))
		moved := !m.since.Equal(before.since) || m.state != before.state || newErr
		switch {
		case !m.reachable:
			return structs.Errf(structs.CodeHostUnreachable, "host %s went out of reach", host).WithDetail("host", host)
		case moved && (m.state == string(structs.StateReady) || (m.state == string(structs.StateStarting) && m.phase != "")):
			return nil
		case moved && (m.state == string(structs.StateStopped) || m.state == string(structs.StateFailed)):
			if m.lastErr != nil {
				return structs.Errf(m.lastErr.Code, "host %s: %s", host, m.lastErr.Message).WithDetail("host", host)
			}
			return structs.Errf(structs.CodeActivationFailed, "host %s: the member is %s", host, m.state).WithDetail("host", host)
		}
		if expired, err := changes.wait(ctx, deadline.C); expired || err != nil {
			return err
		}
	}
}

// groupWake wakes a parked group: workers first, then the head.
func (s *Server) groupWake(ctx context.Context, p *Placement, ms []member, evict, groups bool) error {
	g := p.Group
	var woken []int
	wake := func(rank int) error {
		for try := 0; ; try++ {
			err := s.callWait(ctx, g.Hosts[rank], p.Deployment, wire.ActionStart, evict)
			if err == nil || try > 0 || !groups || !s.evictGroups(ctx, p.Deployment, err) {
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
				_ = s.callWait(ctx, g.Hosts[r], p.Deployment, wire.ActionPark, false)
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
	s.groups.setDown(p.Deployment, true)
	ms := s.members(ctx, p.Deployment, g)
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
		return s.stopMembers(ctx, p.Deployment, g, ms)
	}
	for rank, host := range g.Hosts {
		if err := s.callWait(ctx, host, p.Deployment, wire.ActionPark, false); err != nil {
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

// stopMembers stops every member (all at once: a rank that loses a peer
// exits anyway). ms, when given, skips the members already stopped.
func (s *Server) stopMembers(ctx context.Context, name string, g *GroupPlacement, ms []member) error {
	s.groups.setDown(name, true)
	errs := make([]error, len(g.Hosts))
	var wg sync.WaitGroup
	for rank, host := range g.Hosts {
		if ms != nil && ms[rank].reachable && ms[rank].state == string(structs.StateStopped) {
			continue
		}
		wg.Add(1)
		go func(rank int, host string) {
			defer wg.Done()
			errs[rank] = s.callWait(ctx, host, name, wire.ActionStop, false)
		}(rank, host)
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil && structs.CodeOf(err) != structs.CodeNotFound {
			return withMember(err, g.Hosts[rank], rank)
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
	return s.stopMembers(ctx, p.Deployment, p.Group, nil)
}

// waitHeadReady waits for the head's readiness within the stall timeout;
// a stalled bring-up stops the group (group_stalled).
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
		ms := s.members(ctx, name, g)
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
		stopRetry := func() bool { return false }
		if slices.ContainsFunc(ms, func(m member) bool { return !m.reachable }) {
			// A member that could not be read may have moved meanwhile
			// with no change to follow: it is read again shortly.
			var retry <-chan struct{}
			retry, stopRetry = retryAfter(memberReadRetry)
			changes = append(changes, recvCase(retry))
		}
		// Past the stall deadline the next turn fails the group.
		_, err := changes.wait(ctx, stall.C)
		stopRetry()
		if err != nil {
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
