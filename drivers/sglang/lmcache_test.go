// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

func TestPlan_LMCache(t *testing.T) {
	f := newFixture(t)
	venv, err := pyengine.MakeVenv(filepath.Join(f.root, "with"), "", map[string]string{"sglang": "0.5.22", "lmcache": "0.5.6"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	det, err := New().Detect(context.Background(), &pb.DetectRequest{Path: venv})
	if err != nil {
		t.Fatal(err)
	}
	with := &pb.Installation{Name: "with", Family: Family, Path: venv, Version: det.GetVersion(), Verified: det.GetVerified(), Digest: det.GetDigest()}
	lctx := launchCtx()
	lctx.LmcachePort = 41399
	cases := []struct {
		name    string
		inst    *pb.Installation
		dep     *pb.Deployment
		runs    bool
		refusal string
		shared  bool // the driver cannot make a network namespace
	}{
		{name: "chat restart_only runs", inst: with, dep: &pb.Deployment{Name: "c", Api: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only"}, runs: true},
		{name: "decisions run without it", inst: with, dep: &pb.Deployment{Name: "j", Api: "decisions", ServedName: "j", ModelDir: f.qwen3}},
		{name: "decisions required refused", inst: with, dep: &pb.Deployment{Name: "j", Api: "decisions", ServedName: "j", ModelDir: f.qwen3, Lmcache: "required"}, refusal: "lmcache_unavailable:decisions"},
		{name: "SGLang 0.5.21 refused", inst: f.old, dep: &pb.Deployment{Name: "c", Api: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only", Lmcache: "required"}, refusal: "lmcache_unavailable:engine_version"},
		// M8: never on the host's loopback, where every local user
		// reaches LMCache's unauthenticated server.
		{name: "not isolated runs without it", inst: with, dep: &pb.Deployment{Name: "c", Api: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only"}, shared: true},
		{name: "not isolated required refused", inst: with, dep: &pb.Deployment{Name: "c", Api: "chat", ServedName: "c", ModelDir: f.qwen3, Residency: "restart_only", Lmcache: "required"}, shared: true, refusal: "lmcache_unavailable:not_isolated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := New()
			d.netns = func() bool { return !c.shared }
			resp, err := d.Plan(context.Background(), &pb.PlanRequest{Installation: c.inst, Deployment: c.dep, Host: &pb.HostPolicy{}, Launch: lctx})
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
			flag := strings.Contains(strings.Join(resp.GetArgv(), " "), "--enable-lmcache")
			if resp.GetLmcache().GetRuns() != c.runs || flag != c.runs || (resp.GetEnv()["LMCACHE_REMOTE_URL"] == "lm://127.0.0.1:41399") != c.runs {
				t.Fatalf("runs %v, --enable-lmcache %v, remote %q; want %v (%s)", resp.GetLmcache().GetRuns(), flag, resp.GetEnv()["LMCACHE_REMOTE_URL"], c.runs, resp.GetLmcache().GetReason())
			}
		})
	}
}
