// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// actionWait bounds an action a client waits for (a start until ready, a
// park until parked).
const actionWait = 10 * time.Minute

// The management endpoints (core/fleet/serverapi) decode a change of a
// placed deployment; the server carries it out here.

// placedAction runs one deployment action on a placed deployment.
func (s *Server) placedAction(ctx context.Context, p *Placement, req wire.ActionRequest) (int, any, error) {
	at := time.Now().UTC()
	ctx, cancel := s.detach(ctx, actionWait)
	defer cancel()
	var err error
	switch req.Action {
	case wire.ActionStart:
		err = s.startPlaced(ctx, p, req)
	case wire.ActionStop:
		err = s.setDesired(ctx, p, structs.DesiredStopped, desiredWait{ready: req.Wait})
	case wire.ActionPark:
		err = s.onEveryHost(ctx, p, &hostv1.DeploymentAction{Deployment: p.Deployment, Action: wire.ActionPark, Instance: -1, Wait: req.Wait})
	case wire.ActionDelete:
		err = s.deletePlaced(ctx, p)
	default:
		err = structs.Errf(structs.CodeInvalidRequest, "unknown action %q (start, stop, park, delete)", req.Action)
	}
	if err != nil {
		return 0, nil, err
	}
	done := req.Wait || req.Action == wire.ActionDelete
	status := http.StatusAccepted
	if done {
		status = http.StatusOK
	}
	return status, wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: p.Deployment, Action: req.Action,
		Revision: p.Revision, AcceptedAt: at, Done: done}, nil
}

// startPlaced starts a placed deployment. With evict, a group member in
// the way on one of its hosts may be parked or stopped too (only the
// server moves a group, all of its members at once): the start then waits
// for its hosts' verdict and, refused for room on a host that runs a
// group member, evicts those groups and starts again.
func (s *Server) startPlaced(ctx context.Context, p *Placement, req wire.ActionRequest) error {
	groups := false
	for _, h := range p.HostNames() {
		groups = groups || s.hostRunsGroup(h)
	}
	admit := req.Evict && groups // the ledgers' verdict decides whether a group is in the way
	err := s.setDesired(ctx, p, structs.DesiredRunning, desiredWait{evict: req.Evict, admit: admit, ready: req.Wait})
	if err == nil || !admit {
		return err
	}
	host, _ := structs.AsError(err).Details["host"].(string)
	if host == "" || !s.evictGroups(ctx, p.Deployment, s.withGroupsOn(err, host, p.Deployment)) {
		return err
	}
	return s.setDesired(ctx, p, structs.DesiredRunning, desiredWait{evict: true, admit: true, ready: req.Wait})
}

// onEveryHost runs one command on every host of p, all at once; the first
// refusal (by host order) is returned.
func (s *Server) onEveryHost(ctx context.Context, p *Placement, a *hostv1.DeploymentAction) error {
	errs := make([]error, len(p.Hosts))
	done := make(chan struct{}, len(p.Hosts))
	for i, hs := range p.Hosts {
		go func(i int, host string) {
			defer func() { done <- struct{}{} }()
			errs[i] = s.command(ctx, host, a)
		}(i, hs.Host)
	}
	for range p.Hosts {
		<-done
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// instanceAction runs an action on one instance of a placed deployment:
// a command to its host, with the host's own index (local); the answer
// names the deployment-wide one (idx).
func (s *Server) instanceAction(ctx context.Context, p *Placement, host string, local, idx int, req wire.ActionRequest) (int, any, error) {
	ctx, cancel := s.detach(ctx, actionWait)
	defer cancel()
	at := time.Now().UTC()
	if err := s.command(ctx, host, &hostv1.DeploymentAction{Deployment: p.Deployment, Action: req.Action, Instance: int32(local),
		Wait: req.Wait, Evict: req.Evict}); err != nil {
		return 0, nil, err
	}
	status := http.StatusAccepted
	if req.Wait {
		status = http.StatusOK
	}
	return status, wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: p.Deployment, Instance: &idx, Action: req.Action,
		Revision: p.Revision, AcceptedAt: at, Done: req.Wait}, nil
}
