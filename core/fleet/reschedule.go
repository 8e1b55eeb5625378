// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/capyctl/capyctl/core/fleet/scheduler"
	"github.com/capyctl/capyctl/core/structs"
)

// Rescheduling: a host lost for longer than reschedule_after (as the
// leader sees it) has its instances placed on other hosts that fit; the
// placement no longer names it, so no server routes to it. When it comes
// back, its share no longer names those deployments and it stops and
// deletes its old copies: the fence is the replicated placement, never a
// race between the two copies. A group, whose placement names its hosts,
// is stopped whole and stays down, the reason in its status.
//
// The default, five minutes, lets an agent restart, an upgrade or a short
// partition pass (the engines keep running through them, and come back
// with their host) and bounds the outage of a machine that is gone; a
// large model loads elsewhere in minutes and takes its memory there, so
// moving sooner costs more than it saves.

// rescheduleLoop moves the instances of hosts lost for longer than
// reschedule_after while this server leads (ctx is the leader's; since,
// when it began leading: a host lost before counts from then).
func (s *Server) rescheduleLoop(ctx context.Context, since time.Time) {
	after := s.o.RescheduleAfter
	if after <= 0 {
		return
	}
	handled := map[string]bool{} // lost hosts moved off, until they link again
	for {
		linksChanged, stateChanged := s.links.changed(), s.State.Changed()
		now := time.Now()
		var next time.Time
		for _, rec := range s.State.Hosts() {
			lostAt, lost := s.lostSince(rec.Name, since)
			if !lost {
				delete(handled, rec.Name)
				continue
			}
			due := lostAt.Add(after)
			if now.Before(due) {
				if next.IsZero() || due.Before(next) {
					next = due
				}
				continue
			}
			if !handled[rec.Name] {
				handled[rec.Name] = true
				s.moveOffLost(ctx, rec.Name, now.Sub(lostAt))
			}
		}
		if !s.waitLost(ctx, next, linksChanged, stateChanged) {
			return
		}
	}
}

// waitLost waits until the next host is due (next; zero: none is), a
// link or the state changes, or ctx ends (false).
func (s *Server) waitLost(ctx context.Context, next time.Time, links, state <-chan struct{}) bool {
	var timer <-chan time.Time
	if !next.IsZero() {
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-links:
	case <-state:
	case <-timer:
	}
	return true
}

// lostSince reports whether a host's link is down on this server and
// since when (no earlier than since).
func (s *Server) lostSince(host string, since time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	switch {
	case h == nil:
		return since, true
	case h.linkCancel != nil:
		return time.Time{}, false
	case h.downSince.After(since):
		return h.downSince, true
	}
	return since, true
}

// moveOffLost places elsewhere what a lost host runs for the cluster, and
// stops the groups it has a member of.
func (s *Server) moveOffLost(ctx context.Context, host string, lost time.Duration) {
	why := fmt.Sprintf("host %s lost for %s (reschedule_after %s)", host, lost.Round(time.Second), s.o.RescheduleAfter)
	for _, p := range s.State.Placements() {
		switch {
		case p.Group != nil && slices.Contains(p.Group.Hosts, host):
			// A group's placement names its hosts: it cannot move; it is
			// stopped whole (a rank alone never serves) and says why.
			s.failGroup(ctx, p.Deployment, p.Group, structs.CodeGroupMemberUncertain,
				why+": the group is stopped and stays down until its host is back (or deploy it again on other hosts)")
		case p.Managed() && slices.Contains(p.HostNames(), host):
			if err := s.moveOff(ctx, p, host); err != nil {
				s.logger.Warn("a lost host's instances could not be placed elsewhere", "host", host, "deployment", p.Deployment, "error", err)
				s.event("reschedule_blocked", host, map[string]any{"deployment": p.Deployment, "code": string(structs.CodeOf(err)), "message": err.Error()})
			}
		}
	}
}

// moveOff places a deployment's instances on host on other hosts that
// take placements (placement.hosts narrows them) and waits for their
// verdicts; a refused share moves on as a deploy's does. With no other
// host at all the placement stays as it is: the deployment comes back
// with its host.
func (s *Server) moveOff(ctx context.Context, p *Placement, host string) error {
	spec, err := specOf(p.Spec)
	if err != nil {
		return err
	}
	var cands []scheduler.Host
	for _, c := range s.candidates(spec.Placement) {
		if c.Name != host {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return structs.Errf(structs.CodeCapacityBlocked, "no other host takes placements for %s (placement.hosts, draining, lost)", p.Deployment)
	}
	before := map[string]int{}
	for _, hs := range p.Hosts {
		before[hs.Host] = hs.Instances
	}
	p.Hosts = toShares(scheduler.Without(fromShares(p.Hosts), host, cands))
	var waiting []HostShare
	tried := map[string]bool{host: true}
	for _, hs := range p.Hosts {
		tried[hs.Host] = true
		if hs.Instances != before[hs.Host] {
			waiting = append(waiting, hs)
		}
	}
	index, err := s.commitPlacement(p, p.Version)
	if err != nil {
		return err
	}
	s.logger.Info("instances placed off a host", "deployment", p.Deployment, "from", host, "to", p.HostNames())
	s.event("deployment_rescheduled", host, map[string]any{"deployment": p.Deployment, "hosts": p.HostNames()})
	ctx, cancel := context.WithTimeout(ctx, placeWait)
	defer cancel()
	return s.bringUp(ctx, p, index, cands, p.Desired == structs.DesiredRunning, waiting, tried)
}
