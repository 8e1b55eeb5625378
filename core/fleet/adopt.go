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
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// adoptLater runs adopt for a host once, in the background, unless one is
// already due for it.
func (s *Server) adoptLater(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[name]; h != nil {
		s.adoptLaterLocked(s.leaderCtx, h)
	}
}

// adoptLaterLocked is adoptLater with mu held, under the leader's context
// ctx. Only the leader changes the state: a follower a host is linked to
// leaves its deployments to the leader (ctx nil), which has a link of its
// own and adopts again for every linked host when it is elected.
func (s *Server) adoptLaterLocked(ctx context.Context, h *liveHost) {
	if ctx == nil || ctx.Err() != nil {
		return
	}
	if h.adoptDue {
		h.adoptAgain = true // one at a time per host: the running one goes round again
		return
	}
	h.adoptDue = true
	name := h.name
	s.goRun(func() {
		for {
			s.adopt(ctx, name)
			s.mu.Lock()
			again := h.adoptAgain && ctx.Err() == nil
			h.adoptAgain, h.adoptDue = false, again
			s.mu.Unlock()
			if !again {
				return
			}
		}
	})
}

// hostsOwn counts the instances of each deployment a host's journals
// say it runs of its own (no instance of it placed by the cluster).
func (s *Server) hostsOwn(host string) map[string]int {
	counts := map[string]int{}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil {
		return counts
	}
	placed := map[string]bool{}
	for _, j := range h.journals {
		if j.GetPlaced() {
			placed[j.GetDeployment()] = true // the cluster's own are not the host's to give
		} else if j.GetDeployment() != "" {
			counts[j.GetDeployment()]++
		}
	}
	for dep := range placed {
		delete(counts, dep)
	}
	return counts
}

// adopt places on the server the deployments a host runs that the server
// has no placement for (deployed on the host itself, or a machine that ran
// standalone before it joined), so that they are listed and routed; a
// deployment the server placed on other hosts only is left alone and
// logged. It waits for the host's relay to ask for each one's routes.
func (s *Server) adopt(ctx context.Context, host string) {
	for dep, n := range s.hostsOwn(host) {
		if s.o.RefuseAdoption {
			if _, placed := s.State.Placement(dep); !placed {
				s.logger.Warn("a host runs a deployment the servers did not place; not adopted (adopt_host_deployments = false)", "host", host, "deployment", dep)
			}
			continue
		}
		if p, ok := s.State.Placement(dep); ok {
			if !slices.Contains(p.HostNames(), host) {
				s.logger.Warn("a host runs a deployment the server placed on other hosts; not adopted", "host", host, "deployment", dep, "hosts", p.HostNames())
			}
			continue
		}
		st, ok := s.readOwn(ctx, host, dep)
		if !ok {
			return
		}
		if st.Name == "" {
			continue
		}
		if st.Spec != nil && st.Spec.Group != nil {
			// A member of a group the server has no placement for (one
			// whose placement was undone): one rank alone never serves.
			s.logger.Warn("a host runs a group member the server has no placement for; not adopted (capyctl --address HOST delete deployment NAME on the host)",
				"host", host, "deployment", dep, "rank", st.Spec.Group.Rank)
			continue
		}
		if err := checkAdopted(dep, st); err != nil {
			// A route list is written into the replicated state: what a
			// host says goes through the deployment spec's own rules.
			s.refuseHost(s.guardOf(host), host, refusedInvalid)
			s.logger.Warn("a host's deployment is not adopted", "host", host, "deployment", dep, "error", err)
			continue
		}
		p := &Placement{Deployment: dep, Hosts: []HostShare{{Host: host, Instances: n}}, Routes: st.Routes, Revision: st.Revision, At: time.Now().UTC()}
		// Checked: a placement of that name made meanwhile wins.
		if err := s.apply(fsm.Placed{Placement: p, Checked: true}); err != nil {
			if structs.HasCode(err, structs.CodeConflict) {
				continue // placed meanwhile (by an operator, or another adoption): that one stands
			}
			s.logger.Warn("adopt a host's deployment", "host", host, "deployment", dep, "error", err)
			continue
		}
		s.logger.Info("adopted a deployment the host runs", "host", host, "deployment", dep, "instances", n)
		s.event("deployment_adopted", host, map[string]any{"deployment": dep, "instances": n})
	}
}

// readOwn reads what a host says of a deployment it runs of its own
// (an empty Name: it has none of that name). The relay comes up just
// after the link: a read that fails waits for the host's next change (its
// relay attached, a journal, its link going down), never on a timer; a
// host whose relay does not answer within 10 s is tried again at its next
// journal or Hello (false).
func (s *Server) readOwn(ctx context.Context, host, dep string) (wire.DeploymentStatus, bool) {
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		changes := s.hostChanges([]string{host}) // taken before the read: a change in between is not missed
		var st wire.DeploymentStatus
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(dep), nil, nil)
		if err == nil && status == http.StatusOK && json.Unmarshal(data, &st) == nil {
			return st, true
		}
		if err == nil && status == http.StatusNotFound {
			return wire.DeploymentStatus{}, true
		}
		if expired, err := changes.wait(ctx, deadline.C); expired || err != nil {
			return wire.DeploymentStatus{}, false
		}
	}
}

// maxAdoptedRoutes bounds the model names a deployment a host made
// itself may bring.
const maxAdoptedRoutes = 32

// checkAdopted checks what a host says of a deployment it made itself
// against the deployment spec's rules: its name and each route's, and
// how many routes.
func checkAdopted(dep string, st wire.DeploymentStatus) error {
	if !jobspec.NameRe.MatchString(dep) || st.Name != dep {
		return fmt.Errorf("the host answers for %q as %q", trimForLog(dep), trimForLog(st.Name))
	}
	if len(st.Routes) > maxAdoptedRoutes {
		return fmt.Errorf("%d routes, over %d", len(st.Routes), maxAdoptedRoutes)
	}
	for _, r := range st.Routes {
		if !jobspec.RouteRe.MatchString(r) {
			return fmt.Errorf("route %q is not a model name", trimForLog(r))
		}
	}
	return nil
}
