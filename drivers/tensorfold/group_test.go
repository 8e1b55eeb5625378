// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

func TestDescribe_Groups(t *testing.T) {
	d, err := New().Describe(context.Background(), &sdk.DescribeRequest{})
	if err != nil || !d.Capabilities.Groups {
		t.Fatalf("groups %v (%v)", d.Capabilities.Groups, err)
	}
}

// TestPlan_Group renders both ranks of a TensorFold pair: --tp 2, the
// rank, the head's address and rendezvous port; the peer interface for
// Gloo, no NCCL_* variable; half the weights in the hints.
func TestPlan_Group(t *testing.T) {
	dir := modelDir(t, 4096)
	lo := enginekit.InterfaceOf("127.0.0.1")
	for _, rank := range []int32{0, 1} {
		dep := deployment(dir)
		dep.Group = drivertest.Member(rank, 2, 2, 1, 25000)
		p, err := newDriver(t).Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/v"), Deployment: *dep, Host: sdk.HostPolicy{},
			Launch: sdk.LaunchContext{Port: 41400, LaunchDir: "/state/launches/fold/0-L1"}})
		if err != nil || len(p.Refusals) > 0 {
			t.Fatalf("rank %d: %v %v", rank, err, p.Refusals)
		}
		want := []string{"2", "--rank", strconv.Itoa(int(rank)), "--master", "127.0.0.1", "--master-port", "25000"}
		if got := drivertest.ArgsAfter(p.Argv, "--tp", len(want)); !reflect.DeepEqual(got, want) {
			t.Errorf("rank %d: --tp %v, want %v", rank, got, want)
		}
		if got := drivertest.ArgsAfter(p.Argv, "--port", 1); !reflect.DeepEqual(got, []string{"41400"}) {
			t.Errorf("rank %d: --port %v", rank, got)
		}
		if lo != "" && p.Env["GLOO_SOCKET_IFNAME"] != lo {
			t.Errorf("rank %d: GLOO_SOCKET_IFNAME %q, want %q", rank, p.Env["GLOO_SOCKET_IFNAME"], lo)
		}
		for k := range p.Env {
			if strings.HasPrefix(k, "NCCL_") {
				t.Errorf("%s set", k)
			}
		}
		if h := &p.Hints; h.WeightsBytes != 2048 || !strings.Contains(h.Source, "group rank share") {
			t.Errorf("rank %d: hints %v", rank, h)
		}
		if p.Residency != enginekit.ResidencyRestartOnly {
			t.Errorf("rank %d: residency %q", rank, p.Residency)
		}
	}
}

func TestPlan_GroupRefusals(t *testing.T) {
	dir := modelDir(t, 4096)
	cases := []struct {
		name  string
		group *sdk.Group
		edit  func(*sdk.Deployment)
		codes []string
	}{
		{name: "three machines", group: drivertest.Member(0, 3, 3, 1, 25000), codes: []string{"group_shape_unsupported:tensorfold"}},
		{name: "pipeline parallel", group: drivertest.Member(0, 2, 1, 2, 25000), codes: []string{"group_shape_unsupported:tensorfold"}},
		{name: "tp 4 on two", group: drivertest.Member(1, 2, 4, 1, 25000), codes: []string{"group_shape_unsupported:tensorfold"}},
		{name: "parks deep", group: drivertest.Member(0, 2, 2, 1, 25000), edit: func(d *sdk.Deployment) { d.Residency = "deep" }, codes: []string{"capability_missing:deep_park"}},
		{name: "no peer address", group: &sdk.Group{Rank: 1, Size: 2, TensorParallel: 2, PipelineParallel: 1, HeadAddress: "10.0.0.1", RendezvousPort: 25000}, codes: []string{"peer_address_missing"}},
		{name: "rdma required on a host without", group: &sdk.Group{Rank: 1, Size: 2, TensorParallel: 2, PipelineParallel: 1, HeadAddress: "127.0.0.1", RendezvousPort: 25000, PeerAddress: "127.0.0.1", RequireRDMA: true}, codes: []string{"capability_missing:rdma"}},
		{name: "rank in extra_args", group: drivertest.Member(0, 2, 2, 1, 25000), edit: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--rank", "1"} }, codes: []string{"engine_option_owned:--rank"}},
		{name: "master in extra_args", group: drivertest.Member(0, 2, 2, 1, 25000), edit: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--master=10.0.0.1"} }, codes: []string{"engine_option_owned:--master"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(t)
			d.rdmaDir = t.TempDir()
			dep := deployment(dir)
			dep.Group = c.group
			if c.edit != nil {
				c.edit(dep)
			}
			p, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/v"), Deployment: *dep, Host: sdk.HostPolicy{}})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range p.Refusals {
				got = append(got, r.Code)
			}
			if !reflect.DeepEqual(got, c.codes) {
				t.Fatalf("refusals %v, want %v", p.Refusals, c.codes)
			}
		})
	}
}

// TestGroup_TwoRanks launches a TensorFold pair through two real driver
// plugins against the fake engine on loopback: rank 1 is ready once it
// runs, the head answers, a killed rank 1 ends the head.
func TestGroup_TwoRanks(t *testing.T) {
	dep := deployment(modelDir(t, 1<<20))
	dep.Resources.DeviceBytes = 2 << 30
	drivertest.GroupRun{Family: Family, Venv: venv(t, "0.6.6", true), Size: 2, TP: 2, PP: 1, Deployment: dep}.Run(t)
}
