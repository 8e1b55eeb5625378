// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// groupAction answers a deployment action on a group.
func (s *Server) groupAction(w http.ResponseWriter, r *http.Request, p *Placement, body []byte) {
	var req wire.ActionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the body is not {action, wait, evict}: %v", err))
		return
	}
	run := func(ctx context.Context) error {
		switch req.Action {
		case wire.ActionStart:
			return s.groupStart(ctx, p, req.Evict, req.Evict)
		case wire.ActionPark:
			return s.groupPark(ctx, p)
		case wire.ActionStop:
			return s.groupStop(ctx, p)
		case wire.ActionDelete:
			return s.deleteGroup(ctx, p)
		}
		return structs.Errf(structs.CodeInvalidRequest, "unknown action %q (start, stop, park, delete)", req.Action)
	}
	at := time.Now().UTC()
	done := req.Wait || req.Action == wire.ActionDelete
	if done {
		if err := run(context.WithoutCancel(r.Context())); err != nil {
			writeError(w, err)
			return
		}
	} else {
		s.goRun(func() {
			if err := run(s.ctx); err != nil {
				s.logger.Warn("group action failed", "deployment", p.Deployment, "action", req.Action, "error", err)
			}
		})
	}
	status := http.StatusAccepted
	if done {
		status = http.StatusOK
	}
	writeJSON(w, status, wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: p.Deployment, Action: req.Action,
		Revision: p.Revision, AcceptedAt: at, Done: done})
}

// ensureGroupUp starts a group for a request that names it (on-demand
// activation, as a single host's router does for its own deployments),
// unless an operator stopped it or it activates only on a start.
func (s *Server) ensureGroupUp(ctx context.Context, p *Placement) error {
	if !s.groups.isDown(p.Deployment) && s.journalState(p.Group.Hosts[0], structs.InstanceID(p.Deployment, 0)) == string(structs.StateReady) {
		return nil // the head's host said so last: no call on the request path
	}
	head := s.memberJournal(p.Group.Hosts[0], 0, p.Deployment)
	switch {
	case head.state == string(structs.StateReady):
		return nil
	case !head.reachable:
		return uncertain(p.Deployment, []member{head})
	case p.Reconciled() && p.Group.Ranks[0].Desired == structs.DesiredStopped:
		return nil // the head's host answers deployment_stopped or deployment_inactive
	}
	if s.leaderOnly() != nil {
		// One server moves a group: a follower asks the leader to start it
		// and relays the request once it is up.
		return s.startOnLeader(ctx, p.Deployment)
	}
	// As a request's activation on one host: idle models may be evicted,
	// never another group (it may be serving).
	return s.groupStart(ctx, p, true, false)
}

// startOnLeader asks the leader of the server cluster to start a group
// and waits for its answer (a request's activation); not_leader when no
// leader is known, unavailable when it cannot be reached (retryable).
func (s *Server) startOnLeader(ctx context.Context, name string) error {
	st := s.cl.node.Stats()
	if st.LeaderAddress == "" {
		return s.notLeader(st)
	}
	body, _ := json.Marshal(wire.ActionRequest{Action: wire.ActionStart, Wait: true})
	return postJSON(ctx, s.cl.client, st.LeaderAddress, wire.Prefix+"/deployments/"+url.PathEscape(name)+"/actions", body, nil)
}

// groupStatus completes a group's merged status: each member's rank and
// role, the group's facts, the state of the whole (ready only when every
// member is), a member out of reach marked group_member_uncertain.
func (s *Server) groupStatus(p *Placement, out *wire.DeploymentStatus) {
	g := p.Group
	gs := &wire.GroupStatus{Size: len(g.Hosts), Hosts: g.Hosts, TensorParallel: g.TensorParallel, PipelineParallel: g.PipelineParallel,
		Rendezvous: fmt.Sprintf("%s:%d", g.HeadAddress, g.RendezvousPort), PeerTransport: "unauthenticated",
		LastError: s.groups.err(p.Deployment)}
	states := map[string]int{}
	ready := 0
	for i := range out.Instances {
		in := &out.Instances[i]
		rank := i
		in.Rank = &rank
		in.Role = "worker"
		if rank == 0 {
			in.Role = "head"
		}
		in.ID = structs.InstanceID(p.Deployment, 0) + fmt.Sprintf("#rank%d", rank)
		if in.State == stateUncertain {
			in.LastError = &structs.ErrorRecord{Code: structs.CodeGroupMemberUncertain,
				Message: fmt.Sprintf("host %s's agent is out of reach: the member's state is unknown and its charge is kept", in.Host), At: time.Now().UTC()}
		}
		states[in.State]++
		if in.State == string(structs.StateReady) {
			ready++
		}
	}
	out.Group = gs
	out.Revision = p.Revision // the cluster's: each host counts its member's own
	// ReadyN counts the members ready; the group serves only when all are.
	out.ReadyN = ready
	if ready == len(out.Instances) && ready > 0 {
		out.State = "ready"
	} else {
		out.State = mergeState(states, len(out.Instances), 0)
	}
	if out.Spec != nil {
		spec := *out.Spec
		spec.Instances = 1
		spec.Group = nil
		out.Spec = &spec
	}
}

// deleteGroup stops every rank, then takes the group out of the desired
// state: each host deletes its member from its share. A group placed by
// an earlier build (its hosts run it as their own) is only forgotten.
func (s *Server) deleteGroup(ctx context.Context, p *Placement) error {
	if p.Reconciled() {
		if err := s.groupStop(ctx, p); err != nil {
			return err
		}
	}
	return s.unplaceGroup(ctx, p)
}
