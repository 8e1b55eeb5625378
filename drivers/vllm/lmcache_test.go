// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// installation registers a venv with the given distributions.
func installation(t *testing.T, root, name string, dists map[string]string) *pb.Installation {
	t.Helper()
	venv, err := pyengine.MakeVenv(filepath.Join(root, name), "", dists, nil)
	if err != nil {
		t.Fatal(err)
	}
	det, err := New().Detect(context.Background(), &pb.DetectRequest{Path: venv})
	if err != nil {
		t.Fatal(err)
	}
	return &pb.Installation{Name: name, Family: Family, Path: venv, Version: det.GetVersion(), Verified: det.GetVerified(), Digest: det.GetDigest()}
}

func TestPlan_LMCache(t *testing.T) {
	f := newFixture(t)
	with := installation(t, f.root, "with", map[string]string{"vllm": "0.32.0", "lmcache": "0.5.6"})
	later := installation(t, f.root, "later", map[string]string{"vllm": "0.32.1", "lmcache": "0.5.9"})
	without := installation(t, f.root, "without", map[string]string{"vllm": "0.32.0"})
	old := installation(t, f.root, "old-lmcache", map[string]string{"vllm": "0.32.0", "lmcache": "0.5.5"})
	next := installation(t, f.root, "next-lmcache", map[string]string{"vllm": "0.32.0", "lmcache": "0.6.0"})
	oldVLLM := installation(t, f.root, "old-vllm", map[string]string{"vllm": "0.31.0", "lmcache": "0.5.6"})
	lctx := launchCtx()
	lctx.LmcachePort = 41299
	dep := func(res, mode string) *pb.Deployment {
		return &pb.Deployment{Name: "c", Api: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: res, Lmcache: mode}
	}
	cases := []struct {
		name    string
		inst    *pb.Installation
		dep     *pb.Deployment
		host    *pb.HostPolicy
		runs    bool
		refusal string // the code of a refusal, "" for none
	}{
		{name: "restart_only auto runs", inst: with, dep: dep("restart_only", ""), runs: true},
		{name: "restart_only required runs", inst: with, dep: dep("restart_only", "required"), runs: true},
		{name: "a later 0.5.x runs", inst: later, dep: dep("restart_only", "auto"), runs: true},
		{name: "off", inst: with, dep: dep("restart_only", "off")},
		{name: "deep auto runs without", inst: with, dep: dep("", "auto")},
		{name: "deep required refused", inst: with, dep: dep("", "required"), refusal: "lmcache_unavailable:residency_not_qualified"},
		{name: "host_backed required refused", inst: with, dep: dep("host_backed", "required"), refusal: "lmcache_unavailable:residency_not_qualified"},
		{name: "host off", inst: with, dep: dep("restart_only", "auto"), host: &pb.HostPolicy{Lmcache: "off"}},
		{name: "host off required refused", inst: with, dep: dep("restart_only", "required"), host: &pb.HostPolicy{Lmcache: "off"}, refusal: "lmcache_unavailable:host_off"},
		{name: "retention zero never starts it", inst: with, dep: dep("restart_only", "auto"), host: &pb.HostPolicy{Retention: "zero"}},
		{name: "retention zero required refused", inst: with, dep: dep("restart_only", "required"), host: &pb.HostPolicy{Retention: "zero"}, refusal: "lmcache_unavailable:retention_zero"},
		{name: "not installed", inst: without, dep: dep("restart_only", "auto")},
		{name: "not installed required refused", inst: without, dep: dep("restart_only", "required"), refusal: "lmcache_unavailable:not_installed"},
		{name: "lmcache 0.5.5 refused", inst: old, dep: dep("restart_only", "required"), refusal: "lmcache_unavailable:lmcache_version"},
		{name: "lmcache 0.6.0 refused", inst: next, dep: dep("restart_only", "required"), refusal: "lmcache_unavailable:lmcache_version"},
		{name: "vLLM 0.31 refused", inst: oldVLLM, dep: dep("restart_only", "required"), refusal: "lmcache_unavailable:engine_version"},
		{name: "unknown mode refused", inst: with, dep: dep("restart_only", "always"), refusal: "lmcache_unavailable:mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			host := c.host
			if host == nil {
				host = &pb.HostPolicy{}
			}
			resp, err := isolating(true).Plan(context.Background(), &pb.PlanRequest{Installation: c.inst, Deployment: c.dep, Host: host, Launch: lctx})
			if err != nil {
				t.Fatal(err)
			}
			var codes []string
			for _, r := range resp.GetRefusals() {
				codes = append(codes, r.GetCode())
			}
			if got := strings.Join(codes, ","); got != c.refusal {
				t.Fatalf("refusals %q, want %q", got, c.refusal)
			}
			if c.refusal != "" {
				return
			}
			argv := strings.Join(resp.GetArgv(), " ")
			connector := strings.Contains(argv, "--kv-transfer-config")
			if resp.GetLmcache().GetRuns() != c.runs || connector != c.runs || (resp.GetEnv()["LMCACHE_REMOTE_URL"] != "") != c.runs {
				t.Fatalf("runs %v (connector %v, remote %q), want %v: %s", resp.GetLmcache().GetRuns(), connector, resp.GetEnv()["LMCACHE_REMOTE_URL"], c.runs, resp.GetLmcache().GetReason())
			}
			if c.runs {
				l := resp.GetLmcache()
				if strings.Join(l.GetArgv()[1:], " ") != "-u -m lmcache.v1.server 127.0.0.1 41299 cpu" || resp.GetEnv()["LMCACHE_REMOTE_URL"] != "lm://127.0.0.1:41299" {
					t.Fatalf("server %v, remote %q", l.GetArgv(), resp.GetEnv()["LMCACHE_REMOTE_URL"])
				}
				if resp.GetHints().GetBesideHostBytes() != l.GetPoolBytes()+l.GetServerBytes() || l.GetPoolBytes() != pyengine.DefaultLMCachePool {
					t.Fatalf("beside %d, pool %d", resp.GetHints().GetBesideHostBytes(), l.GetPoolBytes())
				}
			}
		})
	}

	// The golden launch: the server, its variables and the engine's.
	d := dep("restart_only", "required")
	d.LmcachePoolBytes = 8 << 30
	resp, err := isolating(true).Plan(context.Background(), &pb.PlanRequest{Installation: with, Deployment: d, Host: &pb.HostPolicy{}, Launch: lctx})
	if err != nil || len(resp.GetRefusals()) > 0 {
		t.Fatalf("%v %v", err, resp.GetRefusals())
	}
	drivertest.Golden(t, "lmcache_restart_only", drivertest.RenderPlan(resp, map[string]string{f.root: "<tmp>"}))

	// Written before the port is leased: it says it runs, renders nothing.
	resp, err = isolating(true).Plan(context.Background(), &pb.PlanRequest{Installation: with, Deployment: dep("restart_only", ""), Host: &pb.HostPolicy{}})
	if err != nil || !resp.GetLmcache().GetRuns() || len(resp.GetLmcache().GetArgv()) != 0 {
		t.Fatalf("at write time: %v %+v", err, resp.GetLmcache())
	}

	// M8: where the server cannot be isolated (no network namespace: the
	// driver is not root), it never runs on the host's loopback: auto runs
	// without, required is refused.
	resp, err = isolating(false).Plan(context.Background(), &pb.PlanRequest{Installation: with, Deployment: dep("restart_only", "auto"), Host: &pb.HostPolicy{}, Launch: lctx})
	if err != nil || len(resp.GetRefusals()) > 0 || resp.GetLmcache().GetRuns() || strings.Contains(strings.Join(resp.GetArgv(), " "), "--kv-transfer-config") ||
		!strings.Contains(resp.GetLmcache().GetReason(), "network namespace") {
		t.Fatalf("auto, not isolated: %v %v %+v", err, resp.GetRefusals(), resp.GetLmcache())
	}
	resp, err = isolating(false).Plan(context.Background(), &pb.PlanRequest{Installation: with, Deployment: dep("restart_only", "required"), Host: &pb.HostPolicy{}, Launch: lctx})
	if err != nil || len(resp.GetRefusals()) != 1 || resp.GetRefusals()[0].GetCode() != "lmcache_unavailable:not_isolated" {
		t.Fatalf("required, not isolated: %v %v", err, resp.GetRefusals())
	}
}

// isolating is the driver with network namespaces possible or not.
func isolating(ok bool) *Driver {
	d := New()
	d.netns = func() bool { return ok }
	return d
}
