// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
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

// Remove revokes a host's certificate, ends its link and relay and forgets
// it (api.Fleet). Deployments placed on it must be moved or deleted
// first.
func (s *Server) Remove(name string) error {
	s.adoptMu.Lock() // no placement or adoption naming it meanwhile
	defer s.adoptMu.Unlock()
	if _, ok := s.State.Host(name); !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s (capyctl list hosts)", name)
	}
	var deps []string
	for _, p := range s.State.Placements() {
		for _, hs := range p.Hosts {
			if hs.Host == name {
				deps = append(deps, p.Deployment)
			}
		}
	}
	if len(deps) > 0 {
		return structs.Errf(structs.CodeConflict, "host %s runs %s: delete or move them first (capyctl delete deployment NAME)", name, strings.Join(deps, ", ")).
			WithDetail("deployments", deps)
	}
	// One command forgets the host and revokes its certificates on every
	// server.
	if err := s.apply(fsm.HostRemoved{Host: name}); err != nil {
		return err
	}
	// Every server (this one too) closes the host's link and relay once
	// it applied the removal (watchMembers).
	s.event("host_removed", name, nil)
	return nil
}

// placeable returns the most free card memory of a host (its ledger's
// room less its charges, as its last heartbeat said) and whether it takes
// placements (link and relay up, not draining).
func (s *Server) placeable(name string) (free int64, ok bool) {
	rec, known := s.State.Host(name)
	if !known || rec.Drained {
		return 0, false
	}
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
