// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// failGroup stops a whole group after a member failed, its bring-up
// stalled or a park or wake failed, and records why (status shows it).
// The caller holds the group's lock or runs the supervisor.
func (s *Server) failGroup(ctx context.Context, name string, g *GroupPlacement, code structs.Code, msg string) {
	s.groups.setErr(name, &structs.ErrorRecord{Code: code, Message: msg, At: time.Now().UTC()})
	s.logger.Warn("group stopped", "deployment", name, "code", code, "why", msg)
	s.event("group_stopped", g.Hosts[0], map[string]any{"deployment": name, "code": string(code), "message": msg})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), groupCallTimeout)
	defer cancel()
	if err := s.stopMembers(ctx, name, g); err != nil {
		s.logger.Warn("group stop incomplete", "deployment", name, "error", err)
	}
	// A rank that exited on its own meanwhile (its peer's death took it)
	// is part of this failure, not a new one.
	s.markSeen(name, s.members(name, g))
}

// markSeen records the failures members show now as acted on.
func (s *Server) markSeen(name string, ms []member) {
	for _, m := range ms {
		if m.reachable && memberFailed(m.state, m.reason) {
			s.groups.firstSight(name, m.host, m.since.UnixMilli())
		}
	}
}

// watchBringUp follows a group deployed with activate until its head is
// ready, stopping it when it stalls or a member fails.
func (s *Server) watchBringUp(name, id string) {
	p, ok := s.State.Placement(name)
	if !ok || p.Group == nil || p.Group.ID != id {
		return
	}
	l := s.groups.lock(name)
	if l.acquire(s.ctx) != nil {
		return
	}
	defer l.release()
	_ = s.waitHeadReady(s.ctx, name, p.Group)
}

// superviseGroups stops every group one of whose members failed (a killed
// head or worker: the other ranks exit too, and nothing may be left
// running on any host), while this server leads (ctx is the leader's). A
// member whose host is out of reach is uncertain and left as it is until
// its host is back.
//
// It looks again at every journal a host pushes (or a link that comes
// up), never on a timer; a group whose operation was under way is looked
// at again once the operation released the group.
func (s *Server) superviseGroups(ctx context.Context) {
	s.takeBackPending(ctx)
	for {
		more := []<-chan struct{}{s.hostIO.journaled()}
		for _, p := range s.State.Placements() {
			if p.Group == nil {
				continue
			}
			if busy := s.superviseGroup(ctx, p); busy != nil {
				more = append(more, busy)
			}
		}
		if _, err := s.hostIO.changes(nil, more...).wait(ctx, nil); err != nil {
			return
		}
	}
}

// takeBackPending takes back the groups whose placement an earlier leader
// left unfinished (pending: its bring-up ended with its leadership, and
// the deploy that placed them was never answered done): each host deletes
// what it made of them from its share, and their name and routes are
// free again.
func (s *Server) takeBackPending(ctx context.Context) {
	for _, p := range s.State.Placements() {
		if p.Group == nil || !p.Pending || s.groups.isPlacing(p.Group.ID) {
			continue // not a group's, placed, or this server's bring-up under way
		}
		s.logger.Warn("taking back a group an earlier leader left half placed", "deployment", p.Deployment)
		if err := s.unplaceGroup(ctx, p); err != nil {
			s.logger.Warn("take back a half-placed group", "deployment", p.Deployment, "error", err)
			continue
		}
		s.event("group_taken_back", p.Group.Hosts[0], map[string]any{"deployment": p.Deployment,
			"why": "its placement was unfinished when the leader that made it lost its leadership"})
	}
}

// superviseGroup checks one group from its members' journals: a member
// whose engine failed or exited on its own stops the whole group (its
// peers exit too, or hang in a collective), once per failure. A failure
// seen while an operation holds the group is left to a later look: the
// channel returned is closed when the group is released.
func (s *Server) superviseGroup(ctx context.Context, p *Placement) (busy <-chan struct{}) {
	g := p.Group
	id := structs.InstanceID(p.Deployment, 0)
	type failure struct {
		rank  int
		host  string
		since int64
		msg   string
	}
	var failed []failure
	for rank, host := range g.Hosts {
		if j := s.hostIO.journal(host, id); j != nil && memberFailed(j.GetState(), j.GetWhy()) {
			failed = append(failed, failure{rank, host, j.GetSinceUnixMs(), j.GetMessage()})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	l := s.groups.lock(p.Deployment)
	freed := l.freed.changed()
	if !l.tryAcquire() {
		return freed // an operation is under way: look again once it is done
	}
	defer l.release()
	var parts []string
	for _, f := range failed {
		if s.groups.firstSight(p.Deployment, f.host, f.since) {
			parts = append(parts, fmt.Sprintf("rank %d on %s (%s)", f.rank, f.host, f.msg))
		}
	}
	if len(parts) == 0 {
		return nil
	}
	s.failGroup(ctx, p.Deployment, g, structs.CodeGroupMemberFailed, "member failed: "+strings.Join(parts, "; "))
	return nil
}

// evictGroups parks the ready groups a host's capacity refusal names as
// in its way (details.evictable_groups), for a start with evict, and
// stops those that are neither ready nor parked (a bring-up, a failed
// member); it reports whether it freed anything worth a second try.
//
// IMPORTANT: a parked group is never stopped. Its members hold only the
// parked residue each host's ledger charged them when it parked them (a
// park whose footprint does not fit stops instead, on the host: the
// ledger's rules), within the host's parked budget; a park is all an
// eviction takes from a group. A refusal that names a parked group may
// predate its host crediting that park (the ledger lowers a reservation
// on a verified release, and a start that follows the park at once can
// be judged on what the card showed before): stopping the group on it
// threw away a parked group, the operator's, for room the host was about
// to see anyway (TestFleetGroups_StallAndRefusals failed so, once in ~50
// runs under load). An operator who wants the residue back stops the
// group (capyctl stop deployment).
func (s *Server) evictGroups(ctx context.Context, requester string, err error) bool {
	e := structs.AsError(err)
	if e.Code != structs.CodeCapacityBlocked {
		return false
	}
	raw, _ := e.Details["evictable_groups"].([]any)
	var names []string
	for _, v := range raw {
		if n, ok := v.(string); ok && n != requester {
			names = append(names, n)
		}
	}
	if sl, ok := e.Details["evictable_groups"].([]string); ok {
		for _, n := range sl {
			if n != requester {
				names = append(names, n)
			}
		}
	}
	freed := false
	for _, n := range names {
		p, ok := s.State.Placement(n)
		if !ok || p.Group == nil || !s.inTheWayOn(p, e, requester) {
			continue
		}
		s.logger.Info("evicting a group to make room", "group", n, "for", requester)
		l := s.groups.lock(n)
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := l.acquire(lctx)
		cancel()
		if err != nil {
			// IMPORTANT: never wait for ever while holding the requester's
			// own lock: two groups evicting each other would deadlock.
			s.logger.Info("a group in the way is busy; not evicted", "group", n, "for", requester)
			continue
		}
		ms := s.members(n, p.Group)
		var perr error
		switch ms[0].state {
		case string(structs.StateReady):
			perr = s.groupParkLocked(ctx, p)
		case string(structs.StateParked):
			s.logger.Info("a group in the way is parked already; not stopped", "group", n, "for", requester)
			l.release()
			continue
		default:
			perr = s.stopMembers(ctx, n, p.Group)
		}
		l.release()
		if perr == nil {
			freed = true
			s.event("group_evicted", p.Group.Hosts[0], map[string]any{"deployment": n, "for": requester})
		}
	}
	return freed
}

// withGroupsOn completes a capacity refusal read from a member's record
// (which keeps no details) with the other groups that have a member on
// the host: the candidates the host's own refusal would have named.
func (s *Server) withGroupsOn(err error, host, except string) error {
	e := structs.AsError(err)
	if e.Code != structs.CodeCapacityBlocked || e.Details["evictable_groups"] != nil {
		return err
	}
	var names []string
	for _, p := range s.State.Placements() {
		if p.Group != nil && p.Deployment != except && slices.Contains(p.Group.Hosts, host) {
			names = append(names, p.Deployment)
		}
	}
	if len(names) == 0 {
		return err
	}
	return structs.Errf(e.Code, "%s", e.Message).WithDetail("evictable_groups", names).WithDetail("host", host)
}

// hostRunsGroup reports whether a host runs a member of any group.
func (s *Server) hostRunsGroup(host string) bool {
	for _, p := range s.State.Placements() {
		if p.Group != nil && slices.Contains(p.Group.Hosts, host) {
			return true
		}
	}
	return false
}

// journalState is an instance's state as its host's last journal said,
// empty when the host's link is down or it sent none.
func (s *Server) journalState(host, id string) string {
	return s.hostIO.journal(host, id).GetState()
}
