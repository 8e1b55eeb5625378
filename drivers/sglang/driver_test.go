// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// fixture is a registered SGLang venv and model directories in a temp dir.
type fixture struct {
	root  string
	inst  *sdk.Installation
	old   *sdk.Installation // 0.5.21: no decision models
	qwen3 string
	llama string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root := t.TempDir()
	venv, err := pyengine.MakeVenv(filepath.Join(root, "venv"), "", map[string]string{"sglang": "0.5.22", "nvidia-cutlass-dsl": "4.2.1"}, map[string]string{
		"nvidia_cutlass_dsl.pth":                   "nvidia_cutlass_dsl/python_packages\n",
		"nvidia_cutlass_dsl/python_packages/.keep": "",
	})
	if err != nil {
		t.Fatal(err)
	}
	oldVenv, err := pyengine.MakeVenv(filepath.Join(root, "venv-0.5.21"), "", map[string]string{"sglang": "0.5.21"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{root: root}
	f.qwen3, f.llama = drivertest.WriteModels(t, root, `{"chat_template":"<|im_start|><think>\n"}`)
	for _, p := range []struct {
		path string
		into **sdk.Installation
	}{{venv, &f.inst}, {oldVenv, &f.old}} {
		det, err := New().Detect(context.Background(), &sdk.DetectRequest{Path: p.path})
		if err != nil {
			t.Fatal(err)
		}
		*p.into = &sdk.Installation{Name: "sglang", Family: Family, Path: p.path, Version: det.Version, Verified: det.Verified, Digest: det.Digest}
	}
	return f
}

func launchCtx() *sdk.LaunchContext { return drivertest.LaunchContext(41300) }

func TestPlan_Golden(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name string
		dep  *sdk.Deployment
		host *sdk.HostPolicy
		lctx *sdk.LaunchContext
	}{
		{
			name: "default_deep_qwen3",
			dep:  &sdk.Deployment{Name: "chat", API: "chat", ServedName: "chat", ModelDir: f.qwen3},
			host: &sdk.HostPolicy{},
			lctx: launchCtx(),
		},
		{
			name: "host_backed_typed_fields",
			dep: &sdk.Deployment{
				Name: "chat", API: "chat", ServedName: "public-chat", ModelDir: f.llama, Residency: "host_backed",
				MaxConcurrentRequests: 16, ContextLength: 32768, KVCacheDtype: "fp8_e4m3", CUDAGraphs: "false",
				EngineConfigJSON: []byte(`{"chunked_prefill_size":8192,"tool_call_parser":"auto","reasoning_parser":"none"}`),
				AcceptExtraArgs:  true, ExtraArgs: []string{"--enable-mixed-chunk"},
				Env: map[string]string{"TOKENIZERS_PARALLELISM": "false"},
			},
			host: &sdk.HostPolicy{EngineTelemetry: "allow", CUDAHome: "/usr/local/cuda"},
			lctx: launchCtx(),
		},
		{
			name: "decisions_restart_only_at_write_time",
			dep:  &sdk.Deployment{Name: "judge", API: "decisions", ServedName: "judge", ModelDir: f.qwen3, Memory: sdk.MemorySizes{KVCacheBytes: 1 << 30}},
			host: &sdk.HostPolicy{},
		},
		{
			name: "speculative_restarts",
			dep: &sdk.Deployment{Name: "spec", API: "chat", ServedName: "spec", ModelDir: f.qwen3, AcceptExtraArgs: true,
				ExtraArgs: []string{"--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/models/drafts/eagle"}},
			host: &sdk.HostPolicy{ApprovedPaths: []string{"/models/drafts"}},
			lctx: launchCtx(),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: drivertest.Value(c.dep), Host: drivertest.Value(c.host), Launch: drivertest.Value(c.lctx)})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Refusals) > 0 {
				t.Fatalf("refused: %v", resp.Refusals)
			}
			drivertest.Golden(t, c.name, drivertest.RenderPlan(resp, map[string]string{f.root: "<tmp>"}))
		})
	}
}

func TestPlan_Invariants(t *testing.T) {
	f := newFixture(t)
	for _, res := range []string{"", "deep", "host_backed", "restart_only"} {
		dep := &sdk.Deployment{Name: "d", API: "chat", ServedName: "d", ModelDir: f.llama, Residency: res}
		resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
		if err != nil || len(resp.Refusals) > 0 {
			t.Fatalf("%s: %v %v", res, err, resp.Refusals)
		}
		argv := strings.Join(resp.Argv, " ")
		if strings.Contains(argv, "--enable-memory-saver") != (res != "restart_only") {
			t.Errorf("%s: memory saver: %s", res, argv)
		}
		if strings.Contains(argv, "--enable-weights-cpu-backup") != (res == "host_backed") {
			t.Errorf("%s: cpu backup: %s", res, argv)
		}
		for _, want := range []string{"--host 127.0.0.1", "--port 41300", "--max-running-requests 32", "--enable-metrics", "--tokenizer-worker-num 1", "--config /state/launches/chat/0-L1/" + configFile} {
			if !strings.Contains(argv, want) {
				t.Errorf("argv lacks %q: %s", want, argv)
			}
		}
		if strings.Contains(argv, "--api-key") {
			t.Errorf("a key on the command line: %s", argv)
		}
		if e := resp.Env; e["SGLANG_PLUGINS"] != NoPlugins || e["DO_NOT_TRACK"] != "1" {
			t.Errorf("env %v", e)
		}
	}
}

func TestPlan_Refusals(t *testing.T) {
	f := newFixture(t)
	base := func() *sdk.Deployment {
		return &sdk.Deployment{Name: "d", API: "chat", ServedName: "d", ModelDir: f.llama, AcceptExtraArgs: true}
	}
	cases := []struct {
		name  string
		edit  func(d *sdk.Deployment)
		host  *sdk.HostPolicy
		inst  *sdk.Installation
		codes []string
	}{
		{name: "dump option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--debug-tensor-dump-output-folder", "/tmp/x"} }, codes: []string{"engine_option_reserved:--debug-tensor-dump-output-folder"}},
		{name: "dump option even when approved", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--export-metrics-to-file-dir=/srv/m"} },
			host: &sdk.HostPolicy{ApprovedPaths: []string{"/srv"}, ApprovedOptions: []string{"--export-metrics-to-file-dir"}}, codes: []string{"engine_option_reserved:--export-metrics-to-file-dir"}},
		{name: "watermark config", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--watermark-config", "{}"} }, codes: []string{"engine_option_reserved:--watermark-config"}},
		{name: "api key", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--api-key", "x"} }, codes: []string{"engine_option_reserved:--api-key"}},
		{name: "config file", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--config", "/tmp/c.yaml"} }, codes: []string{"engine_option_reserved:--config"}},
		{name: "tp alias", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--tp", "2"} }, codes: []string{"engine_option_owned:--tp-size"}},
		{name: "lmcache", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--lmcache-mp-port", "1"} }, codes: []string{"engine_option_reserved:--lmcache-mp-port"}},
		{name: "owned", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--mem-fraction-static", "0.9"} }, codes: []string{"engine_option_owned:--mem-fraction-static"}},
		{name: "unapproved path option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--speculative-draft-model-path", "/tmp/d"} }, codes: []string{"engine_option_not_approved:--speculative-draft-model-path"}},
		{name: "unapproved dir option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--file-storage-dir", "/tmp/d"} }, codes: []string{"engine_option_not_approved:--file-storage-dir"}},
		{name: "custom loader", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--custom-weight-loader", "m.f"} }, codes: []string{"engine_option_not_approved:--custom-weight-loader"}},
		{name: "dump variable", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"SGLANG_DUMPER_DIR": "/tmp"} }, codes: []string{"engine_env_reserved:SGLANG_DUMPER_DIR"}},
		{name: "dumper variable", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"DUMPER_ENABLE": "1"} }, codes: []string{"engine_env_reserved:DUMPER_ENABLE"}},
		{name: "kernel api variable", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"SGLANG_KERNEL_API_LOGDIR": "/tmp"} }, codes: []string{"engine_env_reserved:SGLANG_KERNEL_API_LOGDIR"}},
		{name: "coredump variable", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"SGLANG_CUDA_COREDUMP": "1"} }, codes: []string{"engine_env_reserved:SGLANG_CUDA_COREDUMP"}},
		{name: "plugins", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"SGLANG_PLUGINS": ""} }, codes: []string{"engine_env_reserved:SGLANG_PLUGINS"}},
		{name: "platform", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"SGLANG_PLATFORM": "x"} }, codes: []string{"engine_env_reserved:SGLANG_PLATFORM"}},
		{name: "smg", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"SMG_PORT": "1"} }, codes: []string{"engine_env_reserved:SMG_PORT"}},
		{name: "unknown config key", edit: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"mem_fraction":0.5}`) }, codes: []string{"unknown_config_key:engine_config.sglang.mem_fraction"}},
		{name: "remote code", edit: func(d *sdk.Deployment) { d.TrustRemoteCode = true }, codes: []string{"remote_code_not_allowed"}},
		{name: "decisions parking", edit: func(d *sdk.Deployment) { d.API = "decisions"; d.Residency = "deep" }, codes: []string{"capability_missing:deep_park"}},
		{name: "decisions with a parser", edit: func(d *sdk.Deployment) {
			d.API = "decisions"
			d.EngineConfigJSON = []byte(`{"tool_call_parser":"qwen25"}`)
		}, codes: []string{"invalid_config"}},
		{name: "decisions on 0.5.21", edit: func(d *sdk.Deployment) { d.API = "decisions" }, inst: f.old, codes: []string{"capability_missing:decisions"}},
		{name: "speculative parking", edit: func(d *sdk.Deployment) {
			d.Residency = "host_backed"
			d.ExtraArgs = []string{"--speculative-algorithm", "NGRAM"}
		}, codes: []string{"capability_missing:deep_park"}},
		{name: "embeddings with a parser", edit: func(d *sdk.Deployment) {
			d.API = "embeddings"
			d.EngineConfigJSON = []byte(`{"reasoning_parser":"qwen3"}`)
		}, codes: []string{"invalid_config"}},
		{name: "another api", edit: func(d *sdk.Deployment) { d.API = "rerank" }, codes: []string{"capability_missing:rerank"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := base()
			c.edit(dep)
			host, inst := c.host, c.inst
			if host == nil {
				host = &sdk.HostPolicy{}
			}
			if inst == nil {
				inst = f.inst
			}
			resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host)})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range resp.Refusals {
				got = append(got, r.Code)
			}
			if strings.Join(got, ",") != strings.Join(c.codes, ",") {
				t.Fatalf("refusals %v, want %v (%v)", got, c.codes, resp.Refusals)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, dists map[string]string) string {
		p, err := pyengine.MakeVenv(filepath.Join(dir, name), "", dists, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name         string
		path         string
		wantCode     string
		wantVersion  string
		wantVerified bool
	}{
		{name: "0.5.22", path: mk("a", map[string]string{"sglang": "0.5.22"}), wantVersion: "0.5.22", wantVerified: true},
		{name: "0.5.20 post", path: mk("b", map[string]string{"sglang": "0.5.20.post1"}), wantVersion: "0.5.20.post1", wantVerified: true},
		{name: "0.5.23 custom", path: mk("c", map[string]string{"sglang": "0.5.23"}), wantVersion: "0.5.23"},
		{name: "0.5.2 custom", path: mk("d", map[string]string{"sglang": "0.5.2"}), wantVersion: "0.5.2"},
		{name: "a vllm venv", path: mk("e", map[string]string{"vllm": "0.31.0"}), wantCode: enginekit.CodeEngineUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := New().Detect(context.Background(), &sdk.DetectRequest{Path: c.path})
			if c.wantCode != "" {
				if sdk.CodeOf(err) != c.wantCode {
					t.Fatalf("Detect = %v, %v; want %s", resp, err, c.wantCode)
				}
				return
			}
			if err != nil || resp.Family != Family || resp.Version != c.wantVersion || resp.Verified != c.wantVerified {
				t.Fatalf("Detect = %+v, %v", resp, err)
			}
		})
	}
}

func TestDescribeAndFlags(t *testing.T) {
	d, _ := New().Describe(context.Background(), &sdk.DescribeRequest{})
	c := &d.Capabilities
	if c.RequestIDField != "rid" || c.AbortMode != sdk.AbortModeRequestID || strings.Join(c.APIs, ",") != "chat,decisions,embeddings" {
		t.Fatalf("Describe = %v", d)
	}
	if err := Table.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEngineKey(t *testing.T) {
	// SGLang re-parses its --config values as command-line tokens: a key
	// that starts with "-" would read as a missing argument.
	for in, want := range map[string]string{"abc": "abc", "-abc": "k-abc", "": ""} {
		if got := engineKey(in); got != want {
			t.Errorf("engineKey(%q) = %q, want %q", in, got, want)
		}
	}
	ep := endpoint(1, "-abc", &sdk.Deployment{ServedName: "m"}, 1, engineapi.NetnsAddr{})
	if ep.AuthValue != "Bearer k-abc" {
		t.Fatalf("endpoint auth %q", ep.AuthValue)
	}
	dir := t.TempDir()
	if err := writeConfig(dir, "-abc"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, configFile))
	if err != nil || !strings.Contains(string(b), `api-key: "k-abc"`) {
		t.Fatalf("config %q, %v", b, err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, configFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("config mode %v", fi.Mode())
	}
}

// TestEndpoint_NonStreamedHangup: with one tokenizer worker a cut request
// is aborted by rid, so a non-streamed request goes to SGLang as it is;
// with more, hang-ups only close the connection and the router streams.
func TestEndpoint_NonStreamedHangup(t *testing.T) {
	cases := []struct {
		workers int64
		abort   sdk.AbortMode
		hangup  sdk.NonStreamedHangup
	}{
		{1, sdk.AbortModeRequestID, sdk.NonStreamedHangupStops},
		{2, sdk.AbortModeCloseConnection, sdk.NonStreamedHangupStream},
	}
	for _, c := range cases {
		ep := endpoint(1, "k", &sdk.Deployment{ServedName: "m"}, c.workers, engineapi.NetnsAddr{})
		if ep.AbortMode != c.abort || ep.NonStreamedHangup != c.hangup {
			t.Errorf("%d workers: abort %v, hang-up %v; want %v, %v", c.workers, ep.AbortMode, ep.NonStreamedHangup, c.abort, c.hangup)
		}
	}
}

// TestPlan_Embeddings: an embedding model runs with --is-embedding and
// without the parsers its family would get for chat.
func TestPlan_Embeddings(t *testing.T) {
	f := newFixture(t)
	for _, api := range []string{"chat", "embeddings"} {
		dep := &sdk.Deployment{Name: "d", API: api, ServedName: "d", ModelDir: f.qwen3, Residency: "restart_only"}
		resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
		if err != nil || len(resp.Refusals) > 0 {
			t.Fatalf("%s: %v %v", api, err, resp.Refusals)
		}
		argv := strings.Join(resp.Argv, " ")
		embeds := api == "embeddings"
		if strings.Contains(argv, "--is-embedding") != embeds || strings.Contains(argv, "--reasoning-parser") == embeds {
			t.Errorf("%s: %s", api, argv)
		}
	}
}
