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
	"github.com/capyctl/capyctl/sdk"
)

// installation registers a venv with the given distributions.
func installation(t *testing.T, root, name string, dists map[string]string) *sdk.Installation {
	t.Helper()
	venv, err := pyengine.MakeVenv(filepath.Join(root, name), "", dists, nil)
	if err != nil {
		t.Fatal(err)
	}
	det, err := New().Detect(context.Background(), &sdk.DetectRequest{Path: venv})
	if err != nil {
		t.Fatal(err)
	}
	return &sdk.Installation{Name: name, Family: Family, Path: venv, Version: det.Version, Verified: det.Verified, Digest: det.Digest}
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
	lctx.LMCachePort = 41299
	dep := func(res, mode string) *sdk.Deployment {
		return &sdk.Deployment{Name: "c", API: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: res, LMCache: mode}
	}
	cases := []struct {
		name    string
		inst    *sdk.Installation
		dep     *sdk.Deployment
		host    *sdk.HostPolicy
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
		{name: "host off", inst: with, dep: dep("restart_only", "auto"), host: &sdk.HostPolicy{LMCache: "off"}},
		{name: "host off required refused", inst: with, dep: dep("restart_only", "required"), host: &sdk.HostPolicy{LMCache: "off"}, refusal: "lmcache_unavailable:host_off"},
		{name: "retention zero never starts it", inst: with, dep: dep("restart_only", "auto"), host: &sdk.HostPolicy{Retention: "zero"}},
		{name: "retention zero required refused", inst: with, dep: dep("restart_only", "required"), host: &sdk.HostPolicy{Retention: "zero"}, refusal: "lmcache_unavailable:retention_zero"},
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
				host = &sdk.HostPolicy{}
			}
			resp, err := isolating(true).Plan(context.Background(), &sdk.PlanRequest{Installation: drivertest.Value(c.inst), Deployment: drivertest.Value(c.dep), Host: drivertest.Value(host), Launch: *lctx})
			if err != nil {
				t.Fatal(err)
			}
			var codes []string
			for _, r := range resp.Refusals {
				codes = append(codes, r.Code)
			}
			if got := strings.Join(codes, ","); got != c.refusal {
				t.Fatalf("refusals %q, want %q", got, c.refusal)
			}
			if c.refusal != "" {
				return
			}
			argv := strings.Join(resp.Argv, " ")
			connector := strings.Contains(argv, "--kv-transfer-config")
			if resp.LMCache.Runs != c.runs || connector != c.runs || (resp.Env["LMCACHE_REMOTE_URL"] != "") != c.runs {
				t.Fatalf("runs %v (connector %v, remote %q), want %v: %s", resp.LMCache.Runs, connector, resp.Env["LMCACHE_REMOTE_URL"], c.runs, resp.LMCache.Reason)
			}
			if c.runs {
				l := &resp.LMCache
				if strings.Join(l.Argv[1:], " ") != "-u -m lmcache.v1.server 127.0.0.1 41299 cpu" || resp.Env["LMCACHE_REMOTE_URL"] != "lm://127.0.0.1:41299" {
					t.Fatalf("server %v, remote %q", l.Argv, resp.Env["LMCACHE_REMOTE_URL"])
				}
				if resp.Hints.BesideHostBytes != l.PoolBytes+l.ServerBytes || l.PoolBytes != pyengine.DefaultLMCachePool {
					t.Fatalf("beside %d, pool %d", resp.Hints.BesideHostBytes, l.PoolBytes)
				}
			}
		})
	}

	// The golden launch: the server, its variables and the engine's.
	d := dep("restart_only", "required")
	d.LMCachePoolBytes = 8 << 30
	resp, err := isolating(true).Plan(context.Background(), &sdk.PlanRequest{Installation: *with, Deployment: *d, Host: sdk.HostPolicy{}, Launch: *lctx})
	if err != nil || len(resp.Refusals) > 0 {
		t.Fatalf("%v %v", err, resp.Refusals)
	}
	drivertest.Golden(t, "lmcache_restart_only", drivertest.RenderPlan(resp, map[string]string{f.root: "<tmp>"}))

	// Written before the port is leased: it says it runs, renders nothing.
	resp, err = isolating(true).Plan(context.Background(), &sdk.PlanRequest{Installation: *with, Deployment: *dep("restart_only", ""), Host: sdk.HostPolicy{}})
	if err != nil || !resp.LMCache.Runs || len(resp.LMCache.Argv) != 0 {
		t.Fatalf("at write time: %v %+v", err, &resp.LMCache)
	}

	// M8: where the server cannot be isolated (no network namespace: the
	// driver is not root), it never runs on the host's loopback: auto runs
	// without, required is refused.
	resp, err = isolating(false).Plan(context.Background(), &sdk.PlanRequest{Installation: *with, Deployment: *dep("restart_only", "auto"), Host: sdk.HostPolicy{}, Launch: *lctx})
	if err != nil || len(resp.Refusals) > 0 || resp.LMCache.Runs || strings.Contains(strings.Join(resp.Argv, " "), "--kv-transfer-config") ||
		!strings.Contains(resp.LMCache.Reason, "network namespace") {
		t.Fatalf("auto, not isolated: %v %v %+v", err, resp.Refusals, &resp.LMCache)
	}
	resp, err = isolating(false).Plan(context.Background(), &sdk.PlanRequest{Installation: *with, Deployment: *dep("restart_only", "required"), Host: sdk.HostPolicy{}, Launch: *lctx})
	if err != nil || len(resp.Refusals) != 1 || resp.Refusals[0].Code != "lmcache_unavailable:not_isolated" {
		t.Fatalf("required, not isolated: %v %v", err, resp.Refusals)
	}
}

// isolating is the driver with network namespaces possible or not.
func isolating(ok bool) *Driver {
	d := New()
	d.netns = func() bool { return ok }
	return d
}
