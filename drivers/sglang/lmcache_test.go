// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
)

func TestPlan_LMCache(t *testing.T) {
	f := newFixture(t)
	venv, err := pyengine.MakeVenv(filepath.Join(f.root, "with"), "", map[string]string{"sglang": "0.5.22", "lmcache": "0.5.6"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	det, err := New().Detect(context.Background(), &sdk.DetectRequest{Path: venv})
	if err != nil {
		t.Fatal(err)
	}
	with := &sdk.Installation{Name: "with", Family: Family, Path: venv, Version: det.Version, Verified: det.Verified, Digest: det.Digest}
	lctx := launchCtx()
	lctx.LMCachePort = 41399
	cases := []struct {
		name    string
		inst    *sdk.Installation
		dep     *sdk.Deployment
		runs    bool
		refusal string
		shared  bool // the driver cannot make a network namespace
	}{
		{name: "chat restart_only runs", inst: with, dep: &sdk.Deployment{Name: "c", API: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only"}, runs: true},
		{name: "decisions run without it", inst: with, dep: &sdk.Deployment{Name: "j", API: "decisions", ServedName: "j", ModelDir: f.qwen3}},
		{name: "decisions required refused", inst: with, dep: &sdk.Deployment{Name: "j", API: "decisions", ServedName: "j", ModelDir: f.qwen3, LMCache: "required"}, refusal: "lmcache_unavailable:decisions"},
		{name: "SGLang 0.5.21 refused", inst: f.old, dep: &sdk.Deployment{Name: "c", API: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only", LMCache: "required"}, refusal: "lmcache_unavailable:engine_version"},
		// M8: never on the host's loopback, where every local user
		// reaches LMCache's unauthenticated server.
		{name: "not isolated runs without it", inst: with, dep: &sdk.Deployment{Name: "c", API: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only"}, shared: true},
		{name: "not isolated required refused", inst: with, dep: &sdk.Deployment{Name: "c", API: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only", LMCache: "required"}, shared: true, refusal: "lmcache_unavailable:not_isolated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := New()
			d.netns = func() bool { return !c.shared }
			resp, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: drivertest.Value(c.inst), Deployment: drivertest.Value(c.dep), Host: sdk.HostPolicy{}, Launch: *lctx})
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
			flag := strings.Contains(strings.Join(resp.Argv, " "), "--enable-lmcache")
			if resp.LMCache.Runs != c.runs || flag != c.runs || (resp.Env["LMCACHE_REMOTE_URL"] == "lm://127.0.0.1:41399") != c.runs {
				t.Fatalf("runs %v, --enable-lmcache %v, remote %q; want %v (%s)", resp.LMCache.Runs, flag, resp.Env["LMCACHE_REMOTE_URL"], c.runs, resp.LMCache.Reason)
			}
		})
	}
}
