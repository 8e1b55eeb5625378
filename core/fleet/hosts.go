// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// Hosts lists every joined host with its link's figures.
func (s *Server) Hosts() []wire.Host {
	out := []wire.Host{}
	for _, rec := range s.State.Hosts() {
		out = append(out, s.hostView(rec))
	}
	return out
}

func (s *Server) hostView(rec HostRecord) wire.Host {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := wire.Host{Name: rec.Name, Role: "host", State: wire.HostLost}
	h := s.hosts[rec.Name]
	if h == nil {
		return v
	}
	v.Address, v.Version = h.addr, h.version
	if !h.lastSeen.IsZero() {
		t := h.lastSeen.UTC()
		v.LastSeen = &t
	}
	if !h.certExpiry.IsZero() {
		t := h.certExpiry.UTC()
		v.CertExpiresAt = &t
	}
	up := h.linkCancel != nil && relayUp(h.relay)
	v.Online = up
	switch {
	case !up:
		v.State = wire.HostLost
	case rec.Drained:
		v.State = wire.HostDraining
	default:
		v.State = wire.HostReady
	}
	used := map[string]int64{}
	for _, r := range h.readings {
		v.ChargedBytes += r.GetChargedBytes()
		used[r.GetDeviceUuid()] = r.GetUsedBytes()
	}
	for _, c := range h.inventory.GetCards() {
		v.GPUs = append(v.GPUs, wire.GPU{Index: int(c.GetIndex()), UUID: c.GetUuid(), Name: c.GetName(), TotalBytes: c.GetMemoryBytes(),
			UsedBytes: used[c.GetUuid()], Unified: h.inventory.GetUnified()})
	}
	for _, e := range h.inventory.GetEngines() {
		v.Engines = append(v.Engines, e.GetName())
	}
	ledger := map[string]any{}
	for _, r := range h.readings {
		ledger[r.GetDomain()] = map[string]any{"capacity_bytes": r.GetCapacityBytes(), "used_bytes": r.GetUsedBytes(),
			"external_bytes": r.GetExternalBytes(), "charged_bytes": r.GetChargedBytes()}
	}
	if len(ledger) > 0 {
		v.Ledger = ledger
	}
	return v
}

// Host returns one host's record and instances (api.Fleet).
func (s *Server) Host(name string) (wire.HostDetail, error) {
	rec, ok := s.State.Host(name)
	if !ok {
		return wire.HostDetail{}, structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	d := wire.HostDetail{Host: s.hostView(rec)}
	s.mu.Lock()
	if h := s.hosts[name]; h != nil {
		for _, j := range h.journals {
			d.Instances = append(d.Instances, wire.HostInstance{Deployment: j.GetDeployment(), InstanceID: j.GetInstanceId(),
				State: j.GetState(), Since: time.UnixMilli(j.GetSinceUnixMs()).UTC(), Charges: j.GetCharges()})
		}
	}
	s.mu.Unlock()
	sort.Slice(d.Instances, func(i, j int) bool { return d.Instances[i].InstanceID < d.Instances[j].InstanceID })
	return d, nil
}

// Drain stops or resumes new placements on a host (api.Fleet).
func (s *Server) Drain(name string, drain bool) error {
	if _, ok := s.State.Host(name); !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	if err := s.apply(fsm.HostDrain{Host: name, Drain: drain}); err != nil {
		return err
	}
	kind := "host_drained"
	if !drain {
		kind = "host_resumed"
	}
	s.event(kind, name, nil)
	return nil
}

// Remove retires a host (api.Fleet): the instances the cluster placed on
// it move to other hosts that fit (the host must be draining: capyctl
// drain host NAME first), then one command forgets it and revokes its
// certificates on every server, which close its link and relay. A group
// member or a deployment the host made itself (adopted) keeps a host
// that is up: delete those first. A host that is lost (it never comes
// back: its link is down) takes them with it: each group with a member
// on it is stopped on its other hosts and forgotten, each deployment it
// made itself is forgotten (event deployment_forgotten, with the reason),
// and their model names are free again.
func (s *Server) Remove(name string) error {
	rec, ok := s.State.Host(name)
	if !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	_, up := s.relayOf(name)
	var blocking []string
	var movable, orphans []*Placement
	for _, p := range s.State.Placements() {
		switch {
		case !slices.Contains(p.HostNames(), name):
		case p.Managed():
			movable = append(movable, p)
		case up:
			blocking = append(blocking, p.Deployment)
		default:
			orphans = append(orphans, p)
		}
	}
	if len(blocking) > 0 {
		return structs.Errf(structs.CodeConflict, "host %s runs %s (a group member, or a deployment made on the host itself): delete them first (capyctl delete deployment NAME)",
			name, strings.Join(blocking, ", ")).WithDetail("deployments", blocking)
	}
	if len(movable) > 0 && !rec.Drained {
		return structs.Errf(structs.CodeConflict, "host %s runs instances of %d deployment(s): drain it first (capyctl drain host %s), then remove it: they move to other hosts",
			name, len(movable), name).WithDetail("deployments", len(movable))
	}
	for _, p := range movable {
		if err := s.moveOff(s.runCtx(), p, name); err != nil {
			return structs.Wrap(structs.CodeOf(err), err, "move %s off host %s before its removal", p.Deployment, name)
		}
	}
	for _, p := range orphans {
		if err := s.forgetWithLostHost(s.runCtx(), p, name); err != nil {
			return structs.Wrap(structs.CodeOf(err), err, "forget %s with host %s", p.Deployment, name)
		}
	}
	// One command forgets the host and revokes its certificates on every
	// server; every server (this one too) closes its link and relay once
	// it applied the removal (watchMembers).
	if err := s.apply(fsm.HostRemoved{Host: name}); err != nil {
		return err
	}
	s.event("host_removed", name, nil)
	return nil
}

// forgetWithLostHost forgets a placement that cannot go on without a lost
// host being removed: a group with a member on it (stopped first on its
// other hosts, which then delete their members from their shares) or a deployment the host
// made itself. The reason is logged and journalled.
func (s *Server) forgetWithLostHost(ctx context.Context, p *Placement, host string) error {
	why := fmt.Sprintf("host %s was removed while out of reach", host)
	if p.Group != nil {
		why += ": the group is stopped on its other hosts and forgotten (deploy it again on other hosts)"
		// Stopped on its other hosts; once unplaced, each deletes its
		// member from its share.
		s.failGroup(ctx, p.Deployment, p.Group, structs.CodeGroupMemberUncertain, why)
	} else {
		why += ": the deployment it made itself is forgotten (its engine ran on that host)"
	}
	if err := s.apply(fsm.Unplaced{Deployment: p.Deployment}); err != nil {
		return err
	}
	s.forgetStatus(p.Deployment)
	s.logger.Warn("deployment forgotten with its removed host", "deployment", p.Deployment, "host", host, "why", why)
	s.event("deployment_forgotten", host, map[string]any{"deployment": p.Deployment, "routes": p.Routes, "why": why})
	return nil
}

// placeable returns the most free card memory of a host and whether it
// takes placements (link and relay up, not draining).
func (s *Server) placeable(name string) (free int64, ok bool) {
	rec, known := s.State.Host(name)
	if !known || rec.Drained {
		return 0, false
	}
	return s.readiness(name)
}

// readiness returns the most free card memory of a host (its ledger's
// room less its charges, as its last heartbeat said) and whether its link
// and relay are up.
func (s *Server) readiness(name string) (free int64, ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[name]
	if h == nil || h.linkCancel == nil || !relayUp(h.relay) {
		return 0, false
	}
	for _, r := range h.readings {
		if strings.HasPrefix(r.GetDomain(), "gpu") || r.GetDomain() == "unified" {
			room := r.GetRoomBytes()
			if room == 0 {
				room = r.GetCapacityBytes()
			}
			if f := room - r.GetChargedBytes(); f > free {
				free = f
			}
		}
	}
	return free, true
}
