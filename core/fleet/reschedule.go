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

// rescheduleRetry is the first wait before a lost host's instances that
// could not all be placed elsewhere are tried again (doubling up to
// rescheduleRetryMax); a host's link or relay coming up tries them at
// once, since that is what most often lets them move.
const (
	rescheduleRetry    = time.Second
	rescheduleRetryMax = 30 * time.Second
)

// lostMove is where the moving of one lost host's instances stands.
type lostMove struct {
	done    bool      // every instance placed elsewhere and up (or none to move)
	tries   int       // attempts that left some unplaced or not up
	retryAt time.Time // when the next attempt is due
	// failed are the deployments whose last attempt failed: blocked (the
	// placement still names the lost host) or placed elsewhere but not
	// brought up there (the placement no longer names it: bringUpAgain).
	failed map[string]bool
}

// rescheduleLoop moves the instances of hosts lost for longer than
// reschedule_after while this server leads (ctx is the leader's; since,
// when it began leading: a host lost before counts from then).
//
// IMPORTANT: an attempt that leaves instances unplaced (no other host
// ready at that moment: one that flapped, or whose relay is not back
// yet; a placement that changed meanwhile) or placed but not brought up
// (their new host refused them, went out of reach, did not answer in
// time) is tried again, on the next link or relay change or after a
// backoff, until the host links again. Marking the host handled on the
// first attempt left its instances on a lost host for good when another
// host was briefly out of reach at the moment it fell due; counting a
// placement committed as a move done left them down on a host that had
// refused them.
func (s *Server) rescheduleLoop(ctx context.Context, since time.Time) {
	after := s.o.RescheduleAfter
	if after <= 0 {
		return
	}
	moves := map[string]*lostMove{} // lost hosts being moved off, until they link again
	for {
		linksChanged, stateChanged := s.links.changed(), s.State.Changed()
		now := time.Now()
		var next time.Time
		soonest := func(t time.Time) {
			if next.IsZero() || t.Before(next) {
				next = t
			}
		}
		for _, rec := range s.State.Hosts() {
			lostAt, lost := s.lostSince(rec.Name, since)
			if !lost {
				delete(moves, rec.Name)
				continue
			}
			if due := lostAt.Add(after); now.Before(due) {
				soonest(due)
				continue
			}
			m := moves[rec.Name]
			if m == nil {
				m = &lostMove{}
				moves[rec.Name] = m
				s.stopLostGroups(ctx, rec.Name, s.lostWhy(rec.Name, now.Sub(lostAt)))
			}
			if m.done || now.Before(m.retryAt) {
				if !m.done {
					soonest(m.retryAt)
				}
				continue
			}
			if m.done = s.moveOffLost(ctx, rec.Name, m); !m.done {
				m.tries++
				m.retryAt = now.Add(min(rescheduleRetry<<min(m.tries-1, 5), rescheduleRetryMax))
				soonest(m.retryAt)
			}
		}
		if !s.waitLost(ctx, next, linksChanged, stateChanged) {
			return
		}
		if linksChangedNow(linksChanged) {
			for _, m := range moves {
				m.retryAt = time.Time{} // a host came up or went: try the blocked again now
			}
		}
	}
}

// linksChangedNow reports whether the links signal c has fired (a
// host's link or relay came up or went).
func linksChangedNow(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
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

// lostWhy is the reason given for what is done about a lost host.
func (s *Server) lostWhy(host string, lost time.Duration) string {
	return fmt.Sprintf("host %s lost for %s (reschedule_after %s)", host, lost.Round(time.Second), s.o.RescheduleAfter)
}

// stopLostGroups stops the groups a lost host has a member of: a
// group's placement names its hosts, so it cannot move; it is stopped
// whole (a rank alone never serves) and says why. Once per loss.
func (s *Server) stopLostGroups(ctx context.Context, host, why string) {
	for _, p := range s.State.Placements() {
		if p.Group != nil && slices.Contains(p.Group.Hosts, host) {
			s.failGroup(ctx, p.Deployment, p.Group, structs.CodeGroupMemberUncertain,
				why+": the group is stopped and stays down until its host is back (or deploy it again on other hosts)")
		}
	}
}

// moveOffLost places elsewhere what a lost host runs for the cluster
// (groups aside: stopLostGroups), and tries again the bring-up of what an
// earlier attempt placed elsewhere but did not bring up (m.failed). It
// reports whether nothing is left to move or bring up; an attempt after
// the first (m.tries) that fails again logs at debug level and adds no
// event.
func (s *Server) moveOffLost(ctx context.Context, host string, m *lostMove) bool {
	first := m.tries == 0
	all := true
	for _, p := range s.State.Placements() {
		if (p.Group != nil && slices.Contains(p.Group.Hosts, host)) || !p.Managed() {
			continue // a group of the host's: stopLostGroups
		}
		var err error
		switch {
		case slices.Contains(p.HostNames(), host):
			err = s.moveOff(ctx, p, host)
		case m.failed[p.Deployment]:
			err = s.bringUpAgain(ctx, p, host)
		default:
			continue
		}
		delete(m.failed, p.Deployment)
		if err == nil {
			continue
		}
		if cur, ok := s.State.Placement(p.Deployment); ok && !slices.Contains(cur.HostNames(), host) && !capacityCodes[structs.CodeOf(err)] {
			// The instances were placed off the host, and the new hosts'
			// refusal is not about room or reach (a plan a host's policy
			// refuses, a spec it cannot run): asking again changes nothing.
			// Said once; the deployment is left where the placement says.
			// (A move that failed before its placement was written, a
			// conflict or a lost leadership, is tried again below.)
			s.logger.Warn("a lost host's instances could not be brought up elsewhere, and are not tried again: the refusal is not about room", "host", host, "deployment", p.Deployment, "error", err)
			s.event("reschedule_blocked", host, map[string]any{"deployment": p.Deployment, "code": string(structs.CodeOf(err)), "message": err.Error(), "retry": false})
			continue
		}
		all = false
		if m.failed == nil {
			m.failed = map[string]bool{}
		}
		m.failed[p.Deployment] = true
		if !first {
			s.logger.Debug("a lost host's instances could not be placed elsewhere again", "host", host, "deployment", p.Deployment, "error", err)
			continue
		}
		s.logger.Warn("a lost host's instances could not be placed elsewhere: trying again when another host comes up", "host", host, "deployment", p.Deployment, "error", err)
		s.event("reschedule_blocked", host, map[string]any{"deployment": p.Deployment, "code": string(structs.CodeOf(err)), "message": err.Error(), "retry": true})
	}
	return all
}

// moveOff places a deployment's instances on host on other hosts that
// take placements (placement.hosts narrows them) and waits for their
// verdicts; a refused share moves on as a deploy's does. With no other
// host at all the placement stays as it is: the deployment comes back
// with its host.
func (s *Server) moveOff(ctx context.Context, p *Placement, host string) error {
	cands, err := s.candidatesBut(p, host)
	if err != nil {
		return err
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

// bringUpAgain tries again to bring up a deployment that an earlier
// attempt moved off host but whose new hosts did not all take their
// share: the hosts are asked to start its instances again (Starts, as an
// operator's start does: only stopped or failed ones start) and their
// verdicts are awaited as the move's were; a capacity refusal moves on to
// another host.
func (s *Server) bringUpAgain(ctx context.Context, p *Placement, host string) error {
	cands, err := s.candidatesBut(p, host)
	if err != nil {
		return err
	}
	p.Starts++
	index, err := s.commitPlacement(p, p.Version)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, placeWait)
	defer cancel()
	return s.bringUp(ctx, p, index, cands, p.Desired == structs.DesiredRunning, slices.Clone(p.Hosts), map[string]bool{host: true})
}

// candidatesBut are the hosts that take placements for p, host aside.
func (s *Server) candidatesBut(p *Placement, host string) ([]scheduler.Host, error) {
	spec, err := specOf(p.Spec)
	if err != nil {
		return nil, err
	}
	var cands []scheduler.Host
	for _, c := range s.candidates(spec.Placement) {
		if c.Name != host {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil, structs.Errf(structs.CodeCapacityBlocked, "no other host takes placements for %s (placement.hosts, draining, lost)", p.Deployment)
	}
	return cands, nil
}
