// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

func TestDescribe_Groups(t *testing.T) {
	d, err := New().Describe(context.Background(), &sdk.DescribeRequest{})
	if err != nil || !d.Capabilities.Groups {
		t.Fatalf("groups %v (%v)", d.Capabilities.Groups, err)
	}
}

// TestPlan_Group renders each rank of vLLM groups: the multiprocessing
// multi-node options on every rank, --headless on the workers only, the
// peer interface for Gloo and VLLM_HOST_IP, no NCCL_* variable, and this
// rank's share of the weights in the hints.
func TestPlan_Group(t *testing.T) {
	f := newFixture(t)
	lo := enginekit.InterfaceOf("127.0.0.1")
	cases := []struct {
		name     string
		group    *sdk.Group
		want     map[string][]string // option → the tokens that follow
		headless bool
		socket   bool
	}{
		{name: "head of two", group: drivertest.Member(0, 2, 2, 1, 25000), socket: true, want: map[string][]string{
			"--tensor-parallel-size": {"2"}, "--pipeline-parallel-size": {"1"}, "--distributed-executor-backend": {"mp"},
			"--nnodes": {"2"}, "--node-rank": {"0"}, "--master-addr": {"127.0.0.1"}, "--master-port": {"25000"}}},
		{name: "worker of two", group: drivertest.Member(1, 2, 2, 1, 25000), headless: true, want: map[string][]string{
			"--tensor-parallel-size": {"2"}, "--pipeline-parallel-size": {"1"}, "--distributed-executor-backend": {"mp"},
			"--nnodes": {"2"}, "--node-rank": {"1"}, "--master-addr": {"127.0.0.1"}, "--master-port": {"25000"}, "--port": {"41234"}}},
		{name: "worker of four, tp 2 pp 2", group: drivertest.Member(3, 4, 2, 2, 25010), headless: true, want: map[string][]string{
			"--tensor-parallel-size": {"2"}, "--pipeline-parallel-size": {"2"}, "--nnodes": {"4"}, "--node-rank": {"3"}, "--master-port": {"25010"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := &sdk.Deployment{Name: "chat", API: "chat", ServedName: "chat", ModelDir: f.qwen3, Group: c.group}
			resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
			if err != nil || len(resp.Refusals) > 0 {
				t.Fatalf("plan: %v %v", err, resp.Refusals)
			}
			argv := resp.Argv
			for opt, want := range c.want {
				if got := drivertest.ArgsAfter(argv, opt, len(want)); !reflect.DeepEqual(got, want) {
					t.Errorf("%s %v, want %v in %v", opt, got, want, argv)
				}
			}
			if drivertest.Has(argv, "--headless") != c.headless {
				t.Errorf("--headless %v, want %v", drivertest.Has(argv, "--headless"), c.headless)
			}
			if drivertest.Has(argv, "--uds") != c.socket {
				t.Errorf("--uds %v, want %v", drivertest.Has(argv, "--uds"), c.socket)
			}
			env := resp.Env
			if env["VLLM_HOST_IP"] != "127.0.0.1" {
				t.Errorf("VLLM_HOST_IP %q", env["VLLM_HOST_IP"])
			}
			if lo != "" && env["GLOO_SOCKET_IFNAME"] != lo {
				t.Errorf("GLOO_SOCKET_IFNAME %q, want %q", env["GLOO_SOCKET_IFNAME"], lo)
			}
			for k := range env {
				if strings.HasPrefix(k, "NCCL_") {
					t.Errorf("%s set", k)
				}
			}
			whole := int64(3 << 30)
			size := int64(c.group.Size)
			if h := &resp.Hints; h.WeightsBytes != (whole+size-1)/size || !strings.Contains(h.Source, "group rank share") {
				t.Errorf("hints weights %d source %q, want the share %d", h.WeightsBytes, h.Source, whole/size)
			}
			if !strings.Contains(strings.Join(resp.Notes, "\n"), "group rank") {
				t.Errorf("no group note in %v", resp.Notes)
			}
		})
	}
	// Without a group, none of it.
	dep := &sdk.Deployment{Name: "chat", API: "chat", ServedName: "chat", ModelDir: f.qwen3}
	resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"--nnodes", "--headless", "--master-addr", "--tensor-parallel-size"} {
		if drivertest.Has(resp.Argv, o) {
			t.Errorf("%s without a group", o)
		}
	}
	if _, ok := resp.Env["VLLM_HOST_IP"]; ok {
		t.Error("VLLM_HOST_IP without a group")
	}
}

// TestPlan_GroupRequireRDMA: a member on a host with require_rdma and an
// RDMA device gets NCCL_NET=IB, which makes NCCL use InfiniBand or RoCE or
// fail the start: it cannot fall back to TCP sockets (the fake engine, as
// NCCL, refuses to start with it where no RDMA device works).
func TestPlan_GroupRequireRDMA(t *testing.T) {
	f := newFixture(t)
	d := New()
	d.rdmaDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(d.rdmaDir, "mlx5_0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, rank := range []int32{0, 1} {
		g := drivertest.Member(rank, 2, 2, 1, 25000)
		g.RequireRDMA = true
		dep := &sdk.Deployment{Name: "chat", API: "chat", ServedName: "chat", ModelDir: f.qwen3, Group: g}
		resp, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
		if err != nil || len(resp.Refusals) > 0 {
			t.Fatalf("rank %d: plan %v %v", rank, err, resp.Refusals)
		}
		if got := resp.Env["NCCL_NET"]; got != "IB" {
			t.Errorf("rank %d: NCCL_NET %q, want IB", rank, got)
		}
	}
}

func TestPlan_GroupRefusals(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name  string
		edit  func(*sdk.Deployment)
		codes []string
	}{
		{name: "no peer address", edit: func(d *sdk.Deployment) { d.Group.PeerAddress = "" }, codes: []string{"peer_address_missing"}},
		{name: "rdma required on a host without", edit: func(d *sdk.Deployment) { d.Group.RequireRDMA = true }, codes: []string{"capability_missing:rdma"}},
		{name: "nnodes in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--nnodes", "4"} }, codes: []string{"engine_option_owned:--nnodes"}},
		{name: "headless in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--headless"} }, codes: []string{"engine_option_owned:--headless"}},
		{name: "master port in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--master-port=1"} }, codes: []string{"engine_option_owned:--master-port"}},
		{name: "backend in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--distributed-executor-backend", "ray"} }, codes: []string{"engine_option_owned:--distributed-executor-backend"}},
		{name: "pp in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--pp", "2"} }, codes: []string{"engine_option_owned:--pipeline-parallel-size"}},
		{name: "host IP in env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"VLLM_HOST_IP": "10.0.0.1"} }, codes: []string{"engine_env_reserved:VLLM_HOST_IP"}},
		{name: "gloo interface in env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"GLOO_SOCKET_IFNAME": "eth0"} }, codes: []string{"engine_env_reserved:GLOO_SOCKET_IFNAME"}},
		{name: "nccl in env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"NCCL_SOCKET_IFNAME": "eth0"} }, codes: []string{"engine_env_reserved:NCCL_SOCKET_IFNAME"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := New()
			d.rdmaDir = t.TempDir() // no RDMA device
			dep := &sdk.Deployment{Name: "chat", API: "chat", ServedName: "chat", ModelDir: f.qwen3, AcceptExtraArgs: true,
				Group: drivertest.Member(1, 2, 2, 1, 25000)}
			c.edit(dep)
			resp, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range resp.Refusals {
				got = append(got, r.Code)
			}
			if !reflect.DeepEqual(got, c.codes) {
				t.Fatalf("refusals %v, want %v", resp.Refusals, c.codes)
			}
		})
	}
}

// TestGroup_TwoRanks launches a two-machine vLLM group through two real
// driver plugins against the fake engine on loopback: the worker is ready
// without a canary, the head answers, the group parks deep (head first)
// and wakes (worker first, then the head with its canary); a killed worker
// leaves the head up (vLLM notices at its next collective) until stopped.
func TestGroup_TwoRanks(t *testing.T) {
	dir := t.TempDir()
	venv := conformance.FakeVenv(t, dir, map[string]string{"vllm": "0.31.0", "torch": "2.9.0"}, nil)
	model := conformance.FakeModel(t, dir, 2<<20)
	drivertest.GroupRun{Family: Family, Venv: venv, Size: 2, TP: 2, PP: 1, ParkTier: enginekit.ResidencyDeep, PeerLossHangs: true,
		Deployment: &sdk.Deployment{Name: "chat", Revision: 1, API: "chat", ServedName: "chat", ModelDir: model}}.Run(t)
}
