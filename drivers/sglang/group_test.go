// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/sdk/enginekit"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

func TestDescribe_Groups(t *testing.T) {
	d, err := New().Describe(context.Background(), &pb.DescribeRequest{})
	if err != nil || !d.GetCapabilities().GetGroups() {
		t.Fatalf("groups %v (%v)", d.GetCapabilities().GetGroups(), err)
	}
}

// TestPlan_Group renders each rank of SGLang groups: the multi-node
// options on every rank, the worker keeping its loopback --host and --port
// (its health check), restart only, the peer interface for Gloo, no
// NCCL_* variable, and this rank's share of the weights in the hints.
func TestPlan_Group(t *testing.T) {
	f := newFixture(t)
	lo := enginekit.InterfaceOf("127.0.0.1")
	cases := []struct {
		name  string
		group *pb.Group
		want  map[string][]string
		note  string
	}{
		{name: "head of two", group: drivertest.Member(0, 2, 2, 1, 25000), want: map[string][]string{
			"--tp-size": {"2"}, "--pp-size": {"1"}, "--nnodes": {"2"}, "--node-rank": {"0"}, "--dist-init-addr": {"127.0.0.1:25000"},
			"--host": {"127.0.0.1"}, "--port": {"41300"}}},
		{name: "worker of two", group: drivertest.Member(1, 2, 2, 1, 25000), note: "health check", want: map[string][]string{
			"--tp-size": {"2"}, "--pp-size": {"1"}, "--nnodes": {"2"}, "--node-rank": {"1"}, "--dist-init-addr": {"127.0.0.1:25000"},
			"--host": {"127.0.0.1"}, "--port": {"41300"}}},
		{name: "worker of three, tp 3", group: drivertest.Member(2, 3, 3, 1, 25099), note: "health check", want: map[string][]string{
			"--tp-size": {"3"}, "--nnodes": {"3"}, "--node-rank": {"2"}, "--dist-init-addr": {"127.0.0.1:25099"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := &pb.Deployment{Name: "chat", Api: "chat", ServedName: "chat", ModelDir: f.qwen3, Group: c.group}
			resp, err := New().Plan(context.Background(), &pb.PlanRequest{Installation: f.inst, Deployment: dep, Host: &pb.HostPolicy{}, Launch: launchCtx()})
			if err != nil || len(resp.GetRefusals()) > 0 {
				t.Fatalf("plan: %v %v", err, resp.GetRefusals())
			}
			argv := resp.GetArgv()
			for opt, want := range c.want {
				if got := drivertest.ArgsAfter(argv, opt, len(want)); !reflect.DeepEqual(got, want) {
					t.Errorf("%s %v, want %v in %v", opt, got, want, argv)
				}
			}
			if resp.GetResidency() != enginekit.ResidencyRestartOnly || drivertest.Has(argv, "--enable-memory-saver") {
				t.Errorf("residency %q, memory saver %v: a group restarts", resp.GetResidency(), drivertest.Has(argv, "--enable-memory-saver"))
			}
			env := resp.GetEnv()
			if lo != "" && env["GLOO_SOCKET_IFNAME"] != lo {
				t.Errorf("GLOO_SOCKET_IFNAME %q, want %q", env["GLOO_SOCKET_IFNAME"], lo)
			}
			for k := range env {
				if strings.HasPrefix(k, "NCCL_") {
					t.Errorf("%s set", k)
				}
			}
			whole, size := int64(3<<30), int64(c.group.GetSize())
			if h := resp.GetHints(); h.GetWeightsBytes() != (whole+size-1)/size || !strings.Contains(h.GetSource(), "group rank share") {
				t.Errorf("hints weights %d source %q", h.GetWeightsBytes(), h.GetSource())
			}
			notes := strings.Join(resp.GetNotes(), "\n")
			if !strings.Contains(notes, "group rank") || !strings.Contains(notes, c.note) {
				t.Errorf("notes %v", resp.GetNotes())
			}
		})
	}
}

func TestPlan_GroupRefusals(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name  string
		edit  func(*pb.Deployment)
		codes []string
	}{
		{name: "deep", edit: func(d *pb.Deployment) { d.Residency = "deep" }, codes: []string{"capability_missing:deep_park"}},
		{name: "host_backed", edit: func(d *pb.Deployment) { d.Residency = "host_backed" }, codes: []string{"capability_missing:deep_park"}},
		{name: "restart_only declared", edit: func(d *pb.Deployment) { d.Residency = "restart_only" }},
		{name: "no peer address", edit: func(d *pb.Deployment) { d.Group.PeerAddress = "" }, codes: []string{"peer_address_missing"}},
		{name: "rdma required on a host without", edit: func(d *pb.Deployment) { d.Group.RequireRdma = true }, codes: []string{"capability_missing:rdma"}},
		{name: "dist-init-addr in extra_args", edit: func(d *pb.Deployment) { d.ExtraArgs = []string{"--dist-init-addr", "10.0.0.1:5000"} }, codes: []string{"engine_option_owned:--dist-init-addr"}},
		{name: "node rank in extra_args", edit: func(d *pb.Deployment) { d.ExtraArgs = []string{"--node-rank=1"} }, codes: []string{"engine_option_owned:--node-rank"}},
		{name: "pp in extra_args", edit: func(d *pb.Deployment) { d.ExtraArgs = []string{"--pipeline-parallel-size", "2"} }, codes: []string{"engine_option_owned:--pp-size"}},
		{name: "gloo interface in env", edit: func(d *pb.Deployment) { d.Env = map[string]string{"GLOO_SOCKET_IFNAME": "eth0"} }, codes: []string{"engine_env_reserved:GLOO_SOCKET_IFNAME"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := New()
			d.rdmaDir = t.TempDir() // no RDMA device
			dep := &pb.Deployment{Name: "chat", Api: "chat", ServedName: "chat", ModelDir: f.qwen3, AcceptExtraArgs: true,
				Group: drivertest.Member(1, 2, 2, 1, 25000)}
			c.edit(dep)
			resp, err := d.Plan(context.Background(), &pb.PlanRequest{Installation: f.inst, Deployment: dep, Host: &pb.HostPolicy{}, Launch: launchCtx()})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range resp.GetRefusals() {
				got = append(got, r.GetCode())
				if strings.HasPrefix(r.GetCode(), "capability_missing:deep_park") && !strings.Contains(r.GetMessage(), `residency = "restart_only"`) {
					t.Errorf("no hint in %q", r.GetMessage())
				}
			}
			if !reflect.DeepEqual(got, c.codes) {
				t.Fatalf("refusals %v, want %v", resp.GetRefusals(), c.codes)
			}
		})
	}
}

// TestGroup_TwoRanks launches a two-machine SGLang group through two real
// driver plugins against the fake engine on loopback: the worker is ready
// on its health check without a canary, the head answers, a killed worker
// ends the head.
func TestGroup_TwoRanks(t *testing.T) {
	dir := t.TempDir()
	venv := conformance.FakeVenv(t, dir, map[string]string{"sglang": "0.5.22"}, nil)
	model := conformance.FakeModel(t, dir, 2<<20)
	drivertest.GroupRun{Family: Family, Venv: venv, Size: 2, TP: 2, PP: 1,
		Deployment: &pb.Deployment{Name: "chat", Revision: 1, Api: "chat", ServedName: "chat", ModelDir: model}}.Run(t)
}
