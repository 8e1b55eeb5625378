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
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

func TestDescribe_Groups(t *testing.T) {
	d, err := New().Describe(context.Background(), &sdk.DescribeRequest{})
	if err != nil || !d.Capabilities.Groups {
		t.Fatalf("groups %v (%v)", d.Capabilities.Groups, err)
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
		group *sdk.Group
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
			if resp.Residency != enginekit.ResidencyRestartOnly || drivertest.Has(argv, "--enable-memory-saver") {
				t.Errorf("residency %q, memory saver %v: a group restarts", resp.Residency, drivertest.Has(argv, "--enable-memory-saver"))
			}
			env := resp.Env
			if lo != "" && env["GLOO_SOCKET_IFNAME"] != lo {
				t.Errorf("GLOO_SOCKET_IFNAME %q, want %q", env["GLOO_SOCKET_IFNAME"], lo)
			}
			for k := range env {
				if strings.HasPrefix(k, "NCCL_") {
					t.Errorf("%s set", k)
				}
			}
			whole, size := int64(3<<30), int64(c.group.Size)
			if h := &resp.Hints; h.WeightsBytes != (whole+size-1)/size || !strings.Contains(h.Source, "group rank share") {
				t.Errorf("hints weights %d source %q", h.WeightsBytes, h.Source)
			}
			notes := strings.Join(resp.Notes, "\n")
			if !strings.Contains(notes, "group rank") || !strings.Contains(notes, c.note) {
				t.Errorf("notes %v", resp.Notes)
			}
		})
	}
}

func TestPlan_GroupRefusals(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name  string
		edit  func(*sdk.Deployment)
		codes []string
	}{
		{name: "deep", edit: func(d *sdk.Deployment) { d.Residency = "deep" }, codes: []string{"capability_missing:deep_park"}},
		{name: "host_backed", edit: func(d *sdk.Deployment) { d.Residency = "host_backed" }, codes: []string{"capability_missing:deep_park"}},
		{name: "restart_only declared", edit: func(d *sdk.Deployment) { d.Residency = "restart_only" }},
		{name: "no peer address", edit: func(d *sdk.Deployment) { d.Group.PeerAddress = "" }, codes: []string{"peer_address_missing"}},
		{name: "rdma required on a host without", edit: func(d *sdk.Deployment) { d.Group.RequireRDMA = true }, codes: []string{"capability_missing:rdma"}},
		{name: "dist-init-addr in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--dist-init-addr", "10.0.0.1:5000"} }, codes: []string{"engine_option_owned:--dist-init-addr"}},
		{name: "node rank in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--node-rank=1"} }, codes: []string{"engine_option_owned:--node-rank"}},
		{name: "pp in extra_args", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--pipeline-parallel-size", "2"} }, codes: []string{"engine_option_owned:--pp-size"}},
		{name: "gloo interface in env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"GLOO_SOCKET_IFNAME": "eth0"} }, codes: []string{"engine_env_reserved:GLOO_SOCKET_IFNAME"}},
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
				if strings.HasPrefix(r.Code, "capability_missing:deep_park") && !strings.Contains(r.Message, `residency = "restart_only"`) {
					t.Errorf("no hint in %q", r.Message)
				}
			}
			if !reflect.DeepEqual(got, c.codes) {
				t.Fatalf("refusals %v, want %v", resp.Refusals, c.codes)
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
		Deployment: &sdk.Deployment{Name: "chat", Revision: 1, API: "chat", ServedName: "chat", ModelDir: model}}.Run(t)
}
