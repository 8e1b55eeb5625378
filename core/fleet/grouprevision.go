// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// A group's new revision (PUT /v1/deployments/<group>) restarts the group
// whole on the new spec, stop then start: every rank of the old revision
// stops, the new spec is written into the group's desired state (each
// rank's host makes its member again from its share), then the group
// starts as a cold start does (the head, admitted by its host's ledger,
// then the workers, then the head's readiness within
// group_stall_timeout). Stop then start needs each host's room once: a
// rolling or side-by-side start would hold both revisions' memory on a
// card at once, which a group, sized to its cards, rarely has. A new
// revision no host can run (a host's refusal of the spec, a ledger's, a
// member that fails or a bring-up that stalls) is refused with that
// refusal's code, and the old revision is written back and, if it was
// running, started again: it fitted before and its room was just freed.

// groupRevision answers PUT on a group.
func (s *Server) groupRevision(w http.ResponseWriter, r *http.Request, p *Placement, body []byte) {
	var req struct {
		Deployment       json.RawMessage `json:"deployment"`
		Activate         bool            `json:"activate"`
		ExpectedRevision uint64          `json:"expected_revision"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Deployment) == 0 {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not {deployment, expected_revision, activate}: %v", err))
		return
	}
	s.receipts.Run(w, r, body, func() (int, any, error) {
		ctx, cancel := s.detach(r.Context(), actionWait)
		defer cancel()
		st, err := s.reviseGroup(ctx, p.Deployment, req.Deployment, req.ExpectedRevision, req.Activate)
		return http.StatusOK, st, err
	})
}

// revisionSpec checks a group's new spec against its placement: the same
// name, the expected revision, still a group, on the same hosts in the
// same order (a group's hosts are its placement: another set is another
// group), its routes free.
func (s *Server) revisionSpec(p *Placement, raw json.RawMessage, expected uint64) (*structs.Deployment, error) {
	spec, err := jobspec.FromJSON(raw)
	if err != nil {
		return nil, err
	}
	name := p.Deployment
	switch {
	case spec.Name != name:
		return nil, structs.Errf(structs.CodeInvalidRequest, "the body names deployment %q, the path %q", spec.Name, name)
	case expected != 0 && expected != p.Revision:
		return nil, structs.Errf(structs.CodeRevisionConflict, "deployment %s is at revision %d, not %d", name, p.Revision, expected).
			WithDetail("current_revision", p.Revision)
	case !spec.IsGroup():
		return nil, structs.Errf(structs.CodeUnsupported,
			"%s is a group: its new revision must be a group too; delete it and deploy the single deployment (capyctl delete deployment %s)", name, name)
	case !slices.Equal(spec.Placement.Hosts, p.Group.Hosts):
		return nil, structs.Errf(structs.CodeUnsupported,
			"group %s runs on hosts %v: a new revision keeps its hosts and their order (placement.hosts); to move it, delete it and deploy it again", name, p.Group.Hosts).
			WithDetail("field", "placement.hosts")
	}
	if err := s.State.RoutesFree(name, spec.Routes); err != nil {
		return nil, err
	}
	return spec, earlierGroup(p)
}

// reviseGroup writes a group's new revision and, when the group was
// started (or activate), starts it; it answers the group's status at the
// new revision. A spec the same as the current one changes nothing.
func (s *Server) reviseGroup(ctx context.Context, name string, raw json.RawMessage, expected uint64, activate bool) (*wire.DeploymentStatus, error) {
	l := s.groups.lock(name)
	if err := l.acquire(ctx); err != nil {
		return nil, err
	}
	defer l.release()
	old, ok := s.State.Placement(name)
	if !ok || old.Group == nil {
		return nil, structs.Errf(structs.CodeNotFound, "group %s was deleted meanwhile", name)
	}
	spec, err := s.revisionSpec(old, raw, expected)
	if err != nil {
		return nil, err
	}
	if cur, err := jobspec.FromJSON(old.Spec); err == nil && structs.SameSpec(cur, spec) {
		// The same spec: nothing restarts; with activate, the group starts
		// (or wakes) unless it is up.
		if activate {
			if err := s.groupStartLocked(ctx, old, false, false); err != nil {
				return nil, err
			}
		}
		st := s.deploymentStatus(ctx, old)
		return &st, nil
	}
	start := activate || old.Group.Ranks[0].Desired == structs.DesiredRunning
	for _, h := range old.Group.Hosts {
		if err := s.memberHostReady(h, name); err != nil {
			return nil, err
		}
	}
	ms := s.members(name, old.Group)
	if err := uncertain(name, ms); err != nil {
		return nil, err
	}
	next, err := s.writeRevision(ctx, old, raw, spec, start || running(ms))
	if err == nil && start {
		err = s.groupStartLocked(ctx, next, false, false)
	}
	if err != nil {
		return nil, s.restoreRevision(ctx, old, next, start, err)
	}
	s.event("group_revised", next.Group.Hosts[0], map[string]any{"deployment": name, "revision": next.Revision, "from": old.Revision})
	st := s.deploymentStatus(ctx, next)
	return &st, nil
}

// running reports whether any member runs something (not stopped, not
// failed).
func running(ms []member) bool {
	for _, m := range ms {
		if m.state != string(structs.StateStopped) && m.state != string(structs.StateFailed) {
			return true
		}
	}
	return false
}

// writeRevision stops every rank of the group when stop says so (its old
// revision runs, or the new one starts), then writes the new spec, every
// rank stopped (or, when nothing ran, each rank's desired state as it
// was: an on-demand group stays on demand), and waits for each host's
// answer: a host that cannot make its member of the new spec refuses it
// (its refusal names the member). The head's host keeps the rendezvous
// port of the same group; an answer with another address is written.
func (s *Server) writeRevision(ctx context.Context, old *Placement, raw json.RawMessage, spec *structs.Deployment, stop bool) (*Placement, error) {
	name := old.Deployment
	if stop {
		if err := s.stopMembers(ctx, name, old.Group); err != nil {
			return nil, err
		}
	}
	cur, ok := s.State.Placement(name)
	if !ok || cur.Group == nil || cur.Group.ID != old.Group.ID {
		return nil, structs.Errf(structs.CodeNotFound, "group %s was deleted or placed again meanwhile", name)
	}
	next := cur
	next.Spec, next.Routes, next.Revision, next.At = raw, spec.Routes, old.Revision+1, time.Now().UTC()
	next.Group.TensorParallel, next.Group.PipelineParallel = spec.Topology.TensorParallel, spec.Topology.PipelineParallel
	for r := range next.Group.Ranks {
		next.Group.Ranks[r].Evict = false
		if stop {
			next.Group.Ranks[r].Desired = structs.DesiredStopped
		}
	}
	index, err := s.commitPlacement(next, cur.Version)
	if err != nil {
		return nil, err
	}
	a, err := s.awaitMember(ctx, next, 0, index, false)
	if err != nil {
		return next, withMember(err, next.Group.Hosts[0], 0)
	}
	addr, port := next.Group.HeadAddress, next.Group.RendezvousPort
	if err := headAddress(a, next); err != nil {
		return next, withMember(err, next.Group.Hosts[0], 0)
	}
	if addr != next.Group.HeadAddress || port != next.Group.RendezvousPort {
		if index, err = s.commitPlacement(next, next.Version); err != nil {
			return next, err
		}
	}
	workers := make([]int, 0, len(next.Group.Hosts)-1)
	changed := make([]bool, len(next.Group.Hosts))
	for r := 1; r < len(next.Group.Hosts); r++ {
		workers, changed[r] = append(workers, r), true
	}
	for _, f := range s.awaitRanks(ctx, next, workers, index, changed, false) {
		return next, withMember(f.err, next.Group.Hosts[f.rank], f.rank)
	}
	return next, nil
}

// restoreRevision takes a refused revision back: the old spec and
// revision written again, every rank stopped (each host makes its member of it
// again) and, when the group was started, started again. The refusal
// comes back, saying what became of the old revision.
func (s *Server) restoreRevision(ctx context.Context, old, next *Placement, start bool, refusal error) error {
	name := old.Deployment
	e := structs.AsError(refusal)
	out := &structs.Error{Code: e.Code, RetryAfter: e.RetryAfter, Cause: e, Details: e.Details}
	say := func(msg string) error {
		out.Message = e.Message + "; " + msg
		s.logger.Warn("a group's new revision was refused", "deployment", name, "revision", old.Revision+1, "error", e.Message, "old", msg)
		return out
	}
	// No stop first: a refused revision's members are stopped already
	// (written stopped, or stopped by the start that failed), and a host
	// that refused the new spec would refuse the stop's share too.
	cur, ok := s.State.Placement(name)
	if !ok || cur.Group == nil || cur.Group.ID != old.Group.ID {
		return say("the group was deleted meanwhile")
	}
	back := cur
	back.Spec, back.Routes, back.Revision, back.At = old.Spec, old.Routes, old.Revision, time.Now().UTC()
	back.Group.TensorParallel, back.Group.PipelineParallel = old.Group.TensorParallel, old.Group.PipelineParallel
	for r := range back.Group.Ranks {
		back.Group.Ranks[r].Desired, back.Group.Ranks[r].Evict = structs.DesiredStopped, false
		if !start && next == nil {
			back.Group.Ranks[r].Desired = old.Group.Ranks[r].Desired
		}
	}
	index, err := s.commitPlacement(back, cur.Version)
	if err == nil {
		all := make([]int, len(back.Group.Hosts))
		changed := make([]bool, len(back.Group.Hosts))
		for r := range all {
			all[r], changed[r] = r, hasShare(back, r)
		}
		for _, f := range s.awaitRanks(ctx, back, all, index, changed, false) {
			err = withMember(f.err, back.Group.Hosts[f.rank], f.rank)
			break
		}
	}
	if err != nil {
		return say("writing the old revision back failed (" + structs.AsError(err).Message + "): deploy it again")
	}
	if !start {
		return say("the group is at its old revision again")
	}
	if err := s.groupStartLocked(ctx, back, false, false); err != nil {
		return say("the old revision was written back but did not start again (" + structs.AsError(err).Message + "): capyctl start deployment " + name)
	}
	return say("the old revision runs again")
}
