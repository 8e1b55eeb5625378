// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// TestManager_StopEndsAStartStillLoading: an operator's stop does not wait
// for a load that never ends (a stalled group's head); the start ends,
// its launch is cleaned up and the instance is stopped.
func TestManager_StopEndsAStartStillLoading(t *testing.T) {
	f := newFixture(t, 10, 1, 0)
	f.drv.probeGate = make(chan struct{})
	defer close(f.drv.probeGate)
	f.deploy("slow")
	if err := f.m.StartDeployment(context.Background(), "slow", StartOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("the readiness wait", func() bool { return f.drv.probing.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.StopDeployment(ctx, "slow", true); err != nil {
		t.Fatalf("stop while loading: %v", err)
	}
	if s := f.state("slow"); s != structs.StateStopped {
		t.Fatalf("after the stop: %s", s)
	}
	if e := f.inst("slow").LastError; e == nil || e.Message != "stopped by an operator before it was ready" {
		t.Fatalf("last error: %+v", e)
	}
}

// groupSpec makes a deployment a group member of rank r.
func groupSpec(rank int) func(*structs.Deployment) {
	return func(d *structs.Deployment) {
		d.Topology = &structs.TopologySpec{TensorParallel: 2, PipelineParallel: 1}
		d.Placement = &structs.PlacementSpec{Hosts: []string{"a", "b"}}
		d.Group = &structs.GroupMember{ID: "g1", Rank: rank, Size: 2, Hosts: []string{"a", "b"}}
		if rank > 0 {
			d.Group.HeadAddress, d.Group.RendezvousPort = "127.0.0.1", 25000
		}
	}
}

// freePorts returns n consecutive ports free on loopback now.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for first := 41000; first < 60000; first += n {
		ok := true
		for p := first; p < first+n && ok; p++ {
			ok = portFree("127.0.0.1", p)
		}
		if ok {
			return first
		}
	}
	t.Fatal("no free port range")
	return 0
}

func TestManager_GroupMembers(t *testing.T) {
	const span = RendezvousSpan
	first := freePorts(t, 2*span+1)
	peer := "127.0.0.1"
	var mu sync.Mutex
	f := newFixture(t, 10, 1, 0, func(c *Config) {
		c.Group = &GroupSettings{FirstPort: first, LastPort: first + 2*span, PeerAddress: func() string {
			mu.Lock()
			defer mu.Unlock()
			return peer
		}}
	})

	// A head gets the host's peer address and the lowest rendezvous port
	// whose span is free; a port something else listens on is skipped; a
	// second head gets the ports after the first's span (SGLang's head
	// binds the ports after its own); a new revision of the same group
	// keeps its port.
	busy, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(first)))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	f.deploy("g", groupSpec(0))
	g := f.spec("g").Group
	if g.PeerAddress != peer || g.HeadAddress != peer || g.RendezvousPort != first+1 {
		t.Fatalf("head member: %+v", g)
	}
	f.deploy("h", groupSpec(0))
	if p := f.spec("h").Group.RendezvousPort; p != first+1+span || p < first+1+7 {
		// SGLang's head with DP attention binds the six ports after its
		// own: the next head starts seven ports on.
		t.Fatalf("second head's port %d, want %d (after the first head's %d ports)", p, first+1+span, span)
	}
	f.deploy("g", groupSpec(0))
	if p := f.spec("g").Group.RendezvousPort; p != first+1 {
		t.Fatalf("a new revision moved the head's port to %d", p)
	}
	spec := &structs.Deployment{Name: "i", Engine: "stub", API: "chat", Routes: []string{"i"}, Instances: 1}
	groupSpec(0)(spec)
	if _, _, err := f.m.Deploy(context.Background(), spec, DeployOptions{}); !structs.HasCode(err, structs.CodeRendezvousPortsExhausted) {
		t.Fatalf("a third head with the range taken: %v", err)
	}

	// A worker keeps the head's address; no peer address is refused.
	f.deploy("w", groupSpec(1))
	if g := f.spec("w").Group; g.HeadAddress != "127.0.0.1" || g.RendezvousPort != 25000 || g.PeerAddress != peer {
		t.Fatalf("worker member: %+v", g)
	}
	mu.Lock()
	peer = ""
	mu.Unlock()
	spec = &structs.Deployment{Name: "x", Engine: "stub", API: "chat", Routes: []string{"x"}, Instances: 1}
	groupSpec(1)(spec)
	if _, _, err := f.m.Deploy(context.Background(), spec, DeployOptions{}); !structs.HasCode(err, structs.CodePeerAddressMissing) {
		t.Fatalf("no peer address: %v", err)
	}

	// A topology without a member (deployed on the host itself) is the
	// server's to place.
	spec = &structs.Deployment{Name: "y", Engine: "stub", API: "chat", Routes: []string{"y"}, Instances: 1}
	groupSpec(0)(spec)
	spec.Group = nil
	if _, _, err := f.m.Deploy(context.Background(), spec, DeployOptions{}); !structs.HasCode(err, structs.CodeUnsupported) {
		t.Fatalf("a topology without a member: %v", err)
	}

	// A member never starts on a request: the server starts its group.
	if err := f.activate("w"); !structs.HasCode(err, structs.CodeUnavailable) {
		t.Fatalf("a request for a member: %v", err)
	}
}

func TestManager_StandaloneRefusesTopology(t *testing.T) {
	f := newFixture(t, 10, 1, 0)
	spec := &structs.Deployment{Name: "g", Engine: "stub", API: "chat", Routes: []string{"g"}, Instances: 1}
	groupSpec(0)(spec)
	if _, _, err := f.m.Deploy(context.Background(), spec, DeployOptions{}); !structs.HasCode(err, structs.CodeUnsupported) {
		t.Fatalf("a group on a role without groups: %v", err)
	}
}

// TestManager_GroupMemberIsNoVictim: a start that needs room never evicts
// a group member on its own; the refusal names the group for the server.
func TestManager_GroupMemberIsNoVictim(t *testing.T) {
	f := newFixture(t, 1, 1, 0, func(c *Config) {
		c.Group = &GroupSettings{FirstPort: 1, LastPort: 0, PeerAddress: func() string { return "127.0.0.1" }}
	})
	f.deploy("member", groupSpec(1))
	if err := f.m.StartDeployment(context.Background(), "member", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	f.deploy("solo")
	err := f.m.StartDeployment(context.Background(), "solo", StartOptions{Wait: true, Evict: true})
	if !structs.HasCode(err, structs.CodeCapacityBlocked) {
		t.Fatalf("start with evict beside a member: %v", err)
	}
	if groups, _ := structs.AsError(err).Details["evictable_groups"].([]string); len(groups) != 1 || groups[0] != "member" {
		t.Fatalf("details: %+v", structs.AsError(err).Details)
	}
	if s := f.state("member"); s != structs.StateReady {
		t.Fatalf("the member was evicted: %s", s)
	}
}

// heldPlacer is the unit placer that also measures a member's memory.
type heldPlacer struct {
	*unitPlacer
	mu          sync.Mutex
	held, ready int64
}

func (p *heldPlacer) DeviceHeld(string) (int64, int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.ready, true
}

// TestManager_GroupParkProvesRelease: a member's park completes once its
// own processes hold at most half its ready charge, and fails within the
// host's bound when they do not (the member is stopped, park_failed).
func TestManager_GroupParkProvesRelease(t *testing.T) {
	hp := &heldPlacer{held: 10 << 30, ready: 12 << 30}
	f := newFixture(t, 10, 1, 0, func(c *Config) {
		hp.unitPlacer = newPlacer(t, 10, 1, 0)
		c.Placer = hp
		c.Group = &GroupSettings{FirstPort: 1, LastPort: 0, PeerAddress: func() string { return "127.0.0.1" }, ProveWithin: 200 * time.Millisecond}
	})
	f.deploy("w", groupSpec(1))
	if err := f.m.StartDeployment(context.Background(), "w", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	// Its rank still holds 10 of 12 GiB: no proof, the park fails.
	f.clock.mu.Lock()
	f.clock.auto = true
	f.clock.mu.Unlock()
	err := f.m.ParkDeployment(context.Background(), "w", true)
	if !structs.HasCode(err, structs.CodeParkFailed) {
		t.Fatalf("park without proof: %v", err)
	}
	if s := f.state("w"); s != structs.StateStopped {
		t.Fatalf("after a failed park: %s", s)
	}
	// Released: the park completes.
	hp.mu.Lock()
	hp.held = 512 << 20
	hp.mu.Unlock()
	if err := f.m.StartDeployment(context.Background(), "w", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.m.ParkDeployment(context.Background(), "w", true); err != nil {
		t.Fatalf("park with its memory released: %v", err)
	}
	if s := f.state("w"); s != structs.StateParked {
		t.Fatalf("after the park: %s", s)
	}
}
