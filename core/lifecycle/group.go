// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// GroupSettings are what a host knows for the group members it runs (one
// model across several machines, placed by the server). Nil in Config: the
// role runs no group (a standalone role).
type GroupSettings struct {
	// PeerAddress is this host's address on the group link (the
	// peer_address setting; never guessed); empty: unset, and a group
	// member is refused (peer_address_missing).
	PeerAddress func() string
	// FirstPort and LastPort are the rendezvous_ports range a head's
	// rendezvous port is picked from (RendezvousSpan ports per head).
	FirstPort, LastPort int
	// RequireRDMA is the host's require_rdma.
	RequireRDMA bool
	// ProveWithin bounds how long a parked member may take to prove its
	// rank released its memory (default 1 minute).
	ProveWithin time.Duration
}

// fillGroup completes a group member the server placed on this host: the
// host's own peer address and RDMA setting and, for a head, a rendezvous
// port from the host's range, with the RendezvousSpan - 1 ports after it
// free and no other head's (kept across revisions of the same group).
// A topology without a member (deployed on the host itself) is refused: a
// group is the server's to place.
func (m *Manager) fillGroup(spec *structs.Deployment) error {
	if spec.Topology == nil && spec.Group == nil {
		return nil
	}
	gs := m.cfg.Group
	if gs == nil {
		return structs.Errf(structs.CodeUnsupported,
			"deployment %s has a topology: one model across several machines runs on a server with hosts joined (capyctl start server); this role runs one machine", spec.Name).
			WithDetail("field", "topology")
	}
	g := spec.Group
	if g == nil {
		return structs.Errf(structs.CodeUnsupported,
			"deployment %s has a topology: deploy it through the server, which places one rank on each host of placement.hosts", spec.Name).
			WithDetail("field", "topology")
	}
	peer := ""
	if gs.PeerAddress != nil {
		peer = gs.PeerAddress()
	}
	if peer == "" {
		return structs.Errf(structs.CodePeerAddressMissing,
			"this host has no peer address for group %s: set peer_address (--peer-address, CAPYCTL_PEER_ADDRESS) to its address on the link between the GPU hosts, one only they reach (group traffic is unauthenticated)", spec.Name)
	}
	g.PeerAddress, g.RequireRDMA = peer, gs.RequireRDMA
	if g.Rank != 0 {
		return nil
	}
	g.HeadAddress = peer
	if g.RendezvousPort != 0 {
		return nil
	}
	used := map[int]bool{}
	m.mu.Lock()
	for name, d := range m.deployments {
		og := d.rec.Spec.Group
		if og == nil || og.Rank != 0 || og.RendezvousPort == 0 {
			continue
		}
		if name == spec.Name && og.ID == g.ID {
			g.RendezvousPort = og.RendezvousPort // a new revision of the same group keeps its port
			m.mu.Unlock()
			return nil
		}
		for i := range RendezvousSpan {
			used[og.RendezvousPort+i] = true
		}
	}
	m.mu.Unlock()
	for p := gs.FirstPort; p > 0 && p+RendezvousSpan-1 <= gs.LastPort; p++ {
		if !spanFree(used, peer, p) {
			continue
		}
		g.RendezvousPort = p
		return nil
	}
	return structs.Errf(structs.CodeRendezvousPortsExhausted,
		"no %d consecutive free ports are left in this host's rendezvous_ports (%d-%d): widen rendezvous_ports or stop another group's head here",
		RendezvousSpan, gs.FirstPort, gs.LastPort)
}

// RendezvousSpan is how many consecutive ports of rendezvous_ports a head
// takes: its rendezvous port (torch.distributed's store) and the six after
// it, which SGLang's head binds for its ZeroMQ sockets with DP attention
// (PortArgs.init_new in python/sglang/srt/server_args.py: port_base =
// dist_init_port + 1 up to port_base + 5, each checked with
// wait_port_available). IMPORTANT: two heads given consecutive ports on one
// host would collide there.
const RendezvousSpan = 7

// spanFree reports whether the RendezvousSpan ports from p are neither
// another head's nor listened on now.
func spanFree(used map[int]bool, addr string, p int) bool {
	for q := p; q < p+RendezvousSpan; q++ {
		if used[q] || !portFree(addr, q) {
			return false
		}
	}
	return true
}

// portFree reports whether nothing listens on addr:port now (the engine
// binds it itself once it starts).
func portFree(addr string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// isGroupMember reports whether an instance's deployment is a group
// member: only the server parks, wakes or stops it, never this host's
// switches (the other ranks would fail with it).
func (m *Manager) isGroupMember(dep string) bool {
	dr, ok := m.spec(dep)
	return ok && dr.Spec.Group != nil
}

// ReleaseProver proves from a launch's own processes that a parked engine
// released its device memory (the placer measures them as NVML does).
type ReleaseProver interface {
	// DeviceHeld returns the device memory the owner's processes hold now
	// and its ready charge on its card; ok is false when nothing could be
	// measured.
	DeviceHeld(owner string) (held, ready int64, ok bool)
}

// proveReleased waits until a parked group member's own processes hold at
// most half of its ready charge, within the host's bound: a worker has no
// API to ask (the head's sleep already put its rank to sleep, or is doing
// so), and a head's answer speaks for the whole group, not for the memory
// its own rank holds on this card. A member with no ready charge on a card
// (a unified pool, nothing planned) proves nothing and passes.
func (in *instance) proveReleased(ctx context.Context) error {
	m := in.m
	rp, ok := m.placer().(ReleaseProver)
	if !ok {
		return nil
	}
	within := time.Minute
	if gs := m.cfg.Group; gs != nil && gs.ProveWithin > 0 {
		within = gs.ProveWithin
	}
	deadline := m.cfg.Now().Add(within)
	interval := 20 * time.Millisecond
	var held, ready int64
	for {
		var measured bool
		held, ready, measured = rp.DeviceHeld(in.id)
		if ready <= 0 || (measured && held <= ready/2) {
			return nil
		}
		if m.cfg.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
		if interval < 500*time.Millisecond {
			interval *= 2
		}
	}
	return structs.Errf(structs.CodeParkFailed,
		"group member %s could not prove its rank released its memory within %s: its processes hold %s of a %s ready charge (at most half is released)",
		in.id, within, structs.FormatBytes(held), structs.FormatBytes(ready))
}
