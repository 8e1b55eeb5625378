// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/capyctl/capyctl/sdk"
)

// member is rank of a two-machine group on loopback.
func member(rank int32) *sdk.Group {
	return &sdk.Group{Rank: rank, Size: 2, TensorParallel: 2, PipelineParallel: 1,
		HeadAddress: "127.0.0.1", RendezvousPort: 25000, PeerAddress: "127.0.0.1"}
}

func TestCheckGroup(t *testing.T) {
	noRDMA := t.TempDir()
	withRDMA := t.TempDir()
	if err := os.Mkdir(filepath.Join(withRDMA, "mlx5_0"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		edit  func(*sdk.Group)
		rdma  string
		codes []string
	}{
		{name: "head", edit: func(*sdk.Group) {}},
		{name: "no group", edit: nil},
		{name: "no peer address", edit: func(g *sdk.Group) { g.PeerAddress = "" }, codes: []string{CodePeerAddressMissing}},
		{name: "rdma required, none", edit: func(g *sdk.Group) { g.RequireRDMA = true }, rdma: noRDMA, codes: []string{"capability_missing:rdma"}},
		{name: "rdma required, directory missing", edit: func(g *sdk.Group) { g.RequireRDMA = true }, rdma: filepath.Join(noRDMA, "absent"), codes: []string{"capability_missing:rdma"}},
		{name: "rdma required, present", edit: func(g *sdk.Group) { g.RequireRDMA = true }, rdma: withRDMA},
		{name: "rank outside", edit: func(g *sdk.Group) { g.Rank = 2 }, codes: []string{"invalid_config"}},
		{name: "no rendezvous port", edit: func(g *sdk.Group) { g.RendezvousPort = 0 }, codes: []string{"invalid_config"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var g *sdk.Group
			if c.edit != nil {
				g = member(1)
				c.edit(g)
			}
			var r Refusals
			CheckGroup(g, GroupOptions{RDMADir: c.rdma}, &r)
			var got []string
			for _, x := range r {
				got = append(got, x.Code)
				if x.Message == "" || x.Field == "" {
					t.Errorf("refusal without a message or field: %v", x)
				}
			}
			if !reflect.DeepEqual(got, c.codes) {
				t.Fatalf("codes %v, want %v", got, c.codes)
			}
		})
	}
}

func TestRefuseGroup(t *testing.T) {
	var r Refusals
	RefuseGroup(&sdk.Deployment{}, "llamacpp", "llama.cpp", &r)
	if len(r) != 0 {
		t.Fatalf("a deployment without a group refused: %v", r)
	}
	RefuseGroup(&sdk.Deployment{Group: member(0)}, "llamacpp", "llama.cpp", &r)
	if len(r) != 1 || r[0].Code != "group_shape_unsupported:llamacpp" {
		t.Fatalf("refusals %v", r)
	}
}

func TestGroupShare(t *testing.T) {
	cases := []struct {
		name string
		n    int64
		g    *sdk.Group
		want int64
	}{
		{"no group", 10, nil, 10},
		{"even", 10, member(0), 5},
		{"rounded up", 11, member(1), 6},
		{"three", 10, &sdk.Group{Size: 3}, 4},
		{"nothing", 0, member(0), 0},
	}
	for _, c := range cases {
		if got := GroupShare(c.n, c.g); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestRendezvousAddr(t *testing.T) {
	g := member(0)
	if got := RendezvousAddr(g); got != "127.0.0.1:25000" {
		t.Fatal(got)
	}
	g.HeadAddress = "fd00::1"
	if got := RendezvousAddr(g); got != "[fd00::1]:25000" {
		t.Fatal(got)
	}
}

func TestInterfaceOf(t *testing.T) {
	var lo string
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Skip(err)
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagLoopback != 0 {
			lo = ifc.Name
		}
	}
	if lo == "" {
		t.Skip("no loopback interface")
	}
	if got := InterfaceOf("127.0.0.1"); got != lo {
		t.Fatalf("InterfaceOf(127.0.0.1) = %q, want %q", got, lo)
	}
	if got := InterfaceOf("192.0.2.77"); got != "" { // TEST-NET-1: no host holds it
		t.Fatalf("InterfaceOf(192.0.2.77) = %q, want none", got)
	}
}

func TestInstance_GroupListener(t *testing.T) {
	in := &Instance{Port: 41000}
	peer := &sdk.Group{Rank: 1, Size: 2, PeerAddress: "10.0.0.2"}
	cases := []struct {
		name  string
		group *sdk.Group
		addr  string
		want  bool
	}{
		{"no group: peer address", nil, "10.0.0.2:25000", false},
		{"no group: every address", nil, "0.0.0.0:25000", false},
		{"peer address", peer, "10.0.0.2:25000", true},
		{"every address", peer, "[::]:25001", true},
		{"another address", peer, "10.0.0.3:25000", false},
		{"the API port on the peer address", peer, "10.0.0.2:41000", false},
		{"the API port everywhere", peer, "0.0.0.0:41000", false},
	}
	for _, c := range cases {
		in.Group = c.group
		if got := in.groupListener(netip.MustParseAddrPort(c.addr)); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestWorker(t *testing.T) {
	in := &Instance{Residency: ResidencyDeep}
	if in.Worker() {
		t.Fatal("a launch of its own is a worker")
	}
	in.Group = member(0)
	if in.Worker() {
		t.Fatal("the head is a worker")
	}
	in.Group = member(1)
	if !in.Worker() {
		t.Fatal("rank 1 is not a worker")
	}
	if p := WorkerPark(in, ""); p.Detail == "" || in.Parked() != ResidencyDeep {
		t.Fatalf("park: %v, parked %q", p, in.Parked())
	}
	if w := WorkerWake(in); w.Canary != "" || in.Parked() != "" {
		t.Fatalf("wake: %v, parked %q", w, in.Parked())
	}
	if l := WorkerLoad(); !l.Known || l.Running != 0 || l.Waiting != 0 || l.KVUsage != 0 {
		t.Fatalf("load %v", l)
	}
}

// TestRDMAEnv: a member on a host with require_rdma gets NCCL_NET=IB, so
// that NCCL cannot fall back to TCP sockets; anything else gets no NCCL_*.
func TestRDMAEnv(t *testing.T) {
	cases := []struct {
		name string
		g    *sdk.Group
		want map[string]string
	}{
		{name: "rdma required", g: &sdk.Group{Rank: 1, Size: 2, RequireRDMA: true}, want: map[string]string{"NCCL_NET": "IB"}},
		{name: "rdma not required", g: &sdk.Group{Rank: 0, Size: 2}, want: map[string]string{}},
		{name: "no group", want: map[string]string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := Env{}
			RDMAEnv(env, c.g)
			if !maps.Equal(map[string]string(env), c.want) {
				t.Fatalf("env %v, want %v", env, c.want)
			}
		})
	}
}
