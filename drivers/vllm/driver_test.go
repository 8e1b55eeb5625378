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
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// fixture is a registered vLLM venv and model directories in a temp dir.
type fixture struct {
	root  string
	inst  *sdk.Installation
	qwen3 string // a Qwen3 checkpoint with a thinking template
	llama string // a Llama checkpoint (unknown family for parsers)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root := t.TempDir()
	venv, err := pyengine.MakeVenv(filepath.Join(root, "venv"), "", map[string]string{"vllm": "0.31.0", "torch": "2.9.0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{root: root}
	f.qwen3, f.llama = drivertest.WriteModels(t, root, `{"chat_template":"{% for m in messages %}<|im_start|>{{m.role}}{% endfor %}<think>\n"}`)
	det, err := New().Detect(context.Background(), &sdk.DetectRequest{Path: venv})
	if err != nil {
		t.Fatal(err)
	}
	f.inst = &sdk.Installation{Name: "vllm", Family: Family, Path: venv, Version: det.Version, Verified: det.Verified, Digest: det.Digest}
	return f
}

func launchCtx() *sdk.LaunchContext { return drivertest.LaunchContext(41234) }

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
			name: "restart_only_typed_fields_telemetry_allowed",
			dep: &sdk.Deployment{
				Name: "chat", API: "chat", ServedName: "public-chat", ModelDir: f.llama, Residency: "restart_only",
				MaxConcurrentRequests: 8, ContextLength: 8192, Dtype: "bfloat16", KVCacheDtype: "fp8", CUDAGraphs: "false",
				AcceptExtraArgs: true, ExtraArgs: []string{"--enable-prefix-caching", "--seed", "7"},
				Env: map[string]string{"VLLM_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false"},
			},
			host: &sdk.HostPolicy{EngineTelemetry: "allow", ApprovedEnv: []string{"VLLM_LOGGING_*"}, CUDAHome: "/usr/local/cuda",
				HostEnv: map[string]string{"CAPYCTL_SIMGPU_STATE": "/state/simgpu.json"}},
			lctx: launchCtx(),
		},
		{
			name: "host_backed_declared_parsers_at_write_time",
			dep: &sdk.Deployment{
				Name: "tools", API: "chat", ServedName: "tools", ModelDir: f.qwen3, Residency: "host_backed",
				Memory:           sdk.MemorySizes{KVCacheBytes: 2 << 30},
				EngineConfigJSON: []byte(`{"tool_call_parser":"qwen3_coder","reasoning_parser":"none","block_size_tokens":32,"max_num_batched_tokens":4096,"safetensors_load_strategy":"lazy"}`),
			},
			host: &sdk.HostPolicy{},
			lctx: nil,
		},
		{
			name: "parser_in_extra_args_and_fitted_context",
			dep: &sdk.Deployment{
				Name: "llama", API: "chat", ServedName: "llama", ModelDir: f.qwen3, TrustRemoteCode: true,
				AcceptExtraArgs: true, ExtraArgs: []string{"--tool-call-parser", "pythonic", "--enable-auto-tool-choice"},
			},
			host: &sdk.HostPolicy{AllowRemoteCode: true},
			lctx: &sdk.LaunchContext{Port: 41235, DeviceBytes: 10 << 30, DeviceTotalBytes: 24 << 30, KVCacheBytes: 1 << 30,
				LaunchDir: "/state/launches/llama/0-L2", InstanceID: "llama/0", LaunchID: "L2"},
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
		for _, telemetry := range []string{"", "off", "allow"} {
			dep := &sdk.Deployment{Name: "d", API: "chat", ServedName: "d", ModelDir: f.llama, Residency: res}
			resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{EngineTelemetry: telemetry}, Launch: *launchCtx()})
			if err != nil || len(resp.Refusals) > 0 {
				t.Fatalf("%s/%s: %v %v", res, telemetry, err, resp.Refusals)
			}
			argv := strings.Join(resp.Argv, " ")
			env := resp.Env
			parks := res != "restart_only"
			if strings.Contains(argv, "--enable-sleep-mode") != parks || (env["VLLM_SERVER_DEV_MODE"] == "1") != parks {
				t.Errorf("%s: sleep mode %v / dev mode %q", res, strings.Contains(argv, "--enable-sleep-mode"), env["VLLM_SERVER_DEV_MODE"])
			}
			off := telemetry != "allow"
			for _, k := range []string{"DO_NOT_TRACK", "VLLM_DO_NOT_TRACK", "VLLM_NO_USAGE_STATS"} {
				if (env[k] == "1") != off {
					t.Errorf("%s/%s: %s=%q", res, telemetry, k, env[k])
				}
			}
			if strings.Contains(argv, "--host") || strings.Contains(argv, "--port") {
				t.Errorf("%s: a socket launch names a host or port: %s", res, argv)
			}
			for _, want := range []string{"--uds /state/launches/chat/0-L1/engine.sock", "--max-num-seqs 32", "--no-enable-log-requests", "--no-enable-log-outputs", "--served-model-name d"} {
				if !strings.Contains(argv, want) {
					t.Errorf("argv lacks %q: %s", want, argv)
				}
			}
			if _, ok := env["VLLM_API_KEY"]; ok || strings.Contains(argv, "--api-key") {
				t.Errorf("a key in the plan: %s %v", argv, env)
			}
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
		codes []string
	}{
		{name: "decisions", edit: func(d *sdk.Deployment) { d.API = "decisions" }, codes: []string{"capability_missing:decisions"}},
		{name: "reserved option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--api-key", "x"} }, codes: []string{"engine_option_reserved:--api-key"}},
		{name: "reserved option with equals", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--uvicorn-log-level=debug"} }, codes: []string{"engine_option_reserved:--uvicorn-log-level"}},
		{name: "reserved abbreviation", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--api-k=x"} }, codes: []string{"engine_option_reserved:--api-key"}},
		{name: "reserved logging field", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--logging-config.level", "DEBUG"} }, codes: []string{"engine_option_reserved:--logging-config"}},
		{name: "owned underscore spelling", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--tensor_parallel_size", "2"} }, codes: []string{"engine_option_owned:--tensor-parallel-size"}},
		{name: "short option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"-tp", "2"} }, codes: []string{"engine_option_reserved:-tp"}},
		{name: "owned option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--max-num-seqs", "64"} }, codes: []string{"engine_option_owned:--max-num-seqs"}},
		{name: "request logging back on", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--enable-log-requests"} }, codes: []string{"engine_option_owned:--enable-log-requests"}},
		{name: "typed field twice", edit: func(d *sdk.Deployment) { d.Dtype = "float16"; d.ExtraArgs = []string{"--dtype", "bfloat16"} }, codes: []string{"engine_option_owned:--dtype"}},
		{name: "unapproved path option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--download-dir", "/tmp/x"} }, codes: []string{"engine_option_not_approved:--download-dir"}},
		{name: "approved path option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--download-dir", "/srv/cache/x"} }, host: &sdk.HostPolicy{ApprovedPaths: []string{"/srv/cache"}}},
		{name: "unapproved config option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--speculative-config", "{}"} }, codes: []string{"engine_option_not_approved:--speculative-config"}},
		{name: "approved config option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--speculative-config", "{}"} }, host: &sdk.HostPolicy{ApprovedOptions: []string{"--speculative-config"}}},
		{name: "extra args not accepted", edit: func(d *sdk.Deployment) { d.AcceptExtraArgs = false; d.ExtraArgs = []string{"--seed", "1"} }, codes: []string{"extra_args_not_accepted"}},
		{name: "reserved env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"VLLM_API_KEY": "x"} }, codes: []string{"engine_env_reserved:VLLM_API_KEY"}},
		{name: "telemetry env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"VLLM_NO_USAGE_STATS": "0"} }, codes: []string{"engine_env_reserved:VLLM_NO_USAGE_STATS"}},
		{name: "do not track", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"DO_NOT_TRACK": "0"} }, codes: []string{"engine_env_reserved:DO_NOT_TRACK"}},
		{name: "dev mode env", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"VLLM_SERVER_DEV_MODE": "1"} }, codes: []string{"engine_env_reserved:VLLM_SERVER_DEV_MODE"}},
		{name: "env not approved", edit: func(d *sdk.Deployment) { d.Env = map[string]string{"HF_TOKEN": "x"} }, codes: []string{"engine_env_not_approved:HF_TOKEN"}},
		{name: "unknown config key", edit: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"gpu_util":0.5}`) }, codes: []string{"unknown_config_key:engine_config.vllm.gpu_util"}},
		{name: "config key of the wrong type", edit: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"block_size_tokens":"big"}`) }, codes: []string{"invalid_config"}},
		{name: "config value not allowed", edit: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"safetensors_load_strategy":"mmap"}`) }, codes: []string{"invalid_config"}},
		{name: "remote code not allowed", edit: func(d *sdk.Deployment) { d.TrustRemoteCode = true }, codes: []string{"remote_code_not_allowed"}},
		{name: "remote code allowed", edit: func(d *sdk.Deployment) { d.TrustRemoteCode = true }, host: &sdk.HostPolicy{AllowRemoteCode: true}},
		{name: "remote code option", edit: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--trust-remote-code"} }, codes: []string{"remote_code_not_allowed"}},
		{name: "host backed on unified memory", edit: func(d *sdk.Deployment) { d.Residency = "host_backed" }, host: &sdk.HostPolicy{Unified: true}, codes: []string{"host_backed_unavailable"}},
		{name: "unknown residency", edit: func(d *sdk.Deployment) { d.Residency = "frozen" }, codes: []string{"invalid_config"}},
		{name: "missing model directory", edit: func(d *sdk.Deployment) { d.ModelDir = "/nonexistent/model" }, codes: []string{"checkpoint_unusable"}},
		{name: "several at once", edit: func(d *sdk.Deployment) {
			d.API = "decisions"
			d.ExtraArgs = []string{"--port", "1"}
			d.Env = map[string]string{"LD_PRELOAD": "/x.so"}
		}, codes: []string{"capability_missing:decisions", "engine_option_owned:--port", "engine_env_reserved:LD_PRELOAD"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := base()
			c.edit(dep)
			host := c.host
			if host == nil {
				host = &sdk.HostPolicy{}
			}
			resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: drivertest.Value(host)})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range resp.Refusals {
				got = append(got, r.Code)
				if r.Message == "" || r.Field == "" {
					t.Errorf("refusal %v lacks a message or field", r)
				}
			}
			if strings.Join(got, ",") != strings.Join(c.codes, ",") {
				t.Fatalf("refusals %v, want %v (%v)", got, c.codes, resp.Refusals)
			}
			if len(got) > 0 && len(resp.Argv) > 0 {
				t.Fatal("a refused plan rendered a command")
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
	verified := mk("v031", map[string]string{"vllm": "0.31.0", "torch": "2.9.0"})
	post := mk("v032post", map[string]string{"vllm": "0.32.1.post1"})
	newer := mk("v033", map[string]string{"vllm": "0.33.0"})
	older := mk("v028", map[string]string{"vllm": "0.28.2"})
	sglang := mk("sglang", map[string]string{"sglang": "0.5.22"})
	notVenv := t.TempDir()
	cases := []struct {
		name         string
		path         string
		wantCode     string
		wantVersion  string
		wantVerified bool
	}{
		{name: "verified", path: verified, wantVersion: "0.31.0", wantVerified: true},
		{name: "verified through bin/python", path: filepath.Join(verified, "bin", "python"), wantVersion: "0.31.0", wantVerified: true},
		{name: "post release", path: post, wantVersion: "0.32.1.post1", wantVerified: true},
		{name: "newer runs as custom", path: newer, wantVersion: "0.33.0"},
		{name: "older runs as custom", path: older, wantVersion: "0.28.2"},
		{name: "another family", path: sglang, wantCode: enginekit.CodeEngineUnsupported},
		{name: "not a venv", path: notVenv, wantCode: enginekit.CodeEngineUnsupported},
		{name: "missing", path: filepath.Join(dir, "nope"), wantCode: sdk.CodeEngineNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := New().Detect(context.Background(), &sdk.DetectRequest{Path: c.path})
			if c.wantCode != "" {
				if sdk.CodeOf(err) != c.wantCode {
					t.Fatalf("Detect = %v, %v; want code %s", resp, err, c.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.Family != Family || resp.Version != c.wantVersion || resp.Verified != c.wantVerified ||
				!strings.HasPrefix(resp.Digest, "sha256:") || !strings.HasSuffix(resp.Program, "/bin/python") {
				t.Fatalf("Detect = %+v", resp)
			}
		})
	}
	// The digest pins the installation: a package installed later changes it.
	a, _ := New().Detect(context.Background(), &sdk.DetectRequest{Path: verified})
	if _, err := pyengine.MakeVenv(verified, "", map[string]string{"extra-package": "1.0"}, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := New().Detect(context.Background(), &sdk.DetectRequest{Path: verified})
	if a.Digest == b.Digest {
		t.Fatal("the digest did not change when a package was installed")
	}
	if _, err := pyengine.CheckPinned(verified, a.Digest); sdk.CodeOf(err) != enginekit.CodeInstallationDrift {
		t.Fatalf("CheckPinned after a change: %v", err)
	}
}

func TestDescribeAndFlags(t *testing.T) {
	d, err := New().Describe(context.Background(), &sdk.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := &d.Capabilities
	if d.Name != Family || d.Protocol != sdk.ProtocolVersion || strings.Join(c.APIs, ",") != "chat,embeddings,rerank" ||
		c.AbortMode != sdk.AbortModeCloseConnection || !c.IdleSignal || len(c.ParkTiers) != 2 {
		t.Fatalf("Describe = %v", d)
	}
	if err := Table.Validate(); err != nil {
		t.Fatal(err)
	}
	fl, err := New().Flags(context.Background(), &sdk.FlagsRequest{})
	if err != nil || fl.Family != Family {
		t.Fatal(fl, err)
	}
	want := map[string]sdk.FlagClass{
		"--api-key": sdk.FlagClassReserved, "--logging-config": sdk.FlagClassReserved,
		"--uvicorn-log-level": sdk.FlagClassReserved, "--enable-scale-out": sdk.FlagClassReserved,
		"--port": sdk.FlagClassOwned, "--enable-log-requests": sdk.FlagClassOwned,
		"--*-config": sdk.FlagClassGated, "--trust-remote-code": sdk.FlagClassGated,
		"VLLM_API_KEY": sdk.FlagClassOwned, "VLLM_DO_NOT_TRACK": sdk.FlagClassOwned,
		"DO_NOT_TRACK": sdk.FlagClassOwned, "VLLM_USAGE_STATS_SERVER": sdk.FlagClassReserved,
	}
	for _, r := range fl.Rules {
		if w, ok := want[r.Name]; ok {
			if r.Class != w {
				t.Errorf("%s is %v, want %v", r.Name, r.Class, w)
			}
			delete(want, r.Name)
		}
	}
	if len(want) > 0 {
		t.Fatalf("rules missing: %v", want)
	}
}

// TestEndpoint_NonStreamedHangup: vLLM aborts a non-streamed request when
// its client disconnects (with_cancellation), so the router forwards one
// as it is.
func TestEndpoint_NonStreamedHangup(t *testing.T) {
	ep := endpoint(1, "k", "m", "", true, engineapi.NetnsAddr{})
	if ep.NonStreamedHangup != sdk.NonStreamedHangupStops || ep.RequestIDHeader != "X-Request-Id" {
		t.Fatalf("endpoint %v", ep)
	}
}

// TestPlan_Embeddings: vLLM serves /v1/embeddings for a pooling model: an
// embeddings deployment is planned (nothing new rendered), without the
// parsers its family would get for chat.
func TestPlan_Embeddings(t *testing.T) {
	f := newFixture(t)
	dep := &sdk.Deployment{Name: "d", API: "embeddings", ServedName: "d", ModelDir: f.qwen3, Residency: "restart_only"}
	resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
	if err != nil || len(resp.Refusals) > 0 {
		t.Fatalf("%v %v", err, resp.Refusals)
	}
	if argv := strings.Join(resp.Argv, " "); strings.Contains(argv, "--reasoning-parser") || strings.Contains(argv, "--tool-call-parser") {
		t.Fatalf("parsers for an embedding model: %s", argv)
	}
}

// TestPlan_Rerank: vLLM serves /v1/rerank for a cross-encoder: a rerank
// deployment is planned (nothing new rendered), without the parsers its
// family would get for chat; a decision model is still refused.
func TestPlan_Rerank(t *testing.T) {
	f := newFixture(t)
	dep := &sdk.Deployment{Name: "d", API: "rerank", ServedName: "d", ModelDir: f.qwen3, Residency: "restart_only"}
	resp, err := New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
	if err != nil || len(resp.Refusals) > 0 {
		t.Fatalf("%v %v", err, resp.Refusals)
	}
	if argv := strings.Join(resp.Argv, " "); strings.Contains(argv, "--reasoning-parser") || strings.Contains(argv, "--tool-call-parser") {
		t.Fatalf("parsers for a reranker: %s", argv)
	}
	dep.API = "decisions"
	resp, err = New().Plan(context.Background(), &sdk.PlanRequest{Installation: *f.inst, Deployment: *dep, Host: sdk.HostPolicy{}, Launch: *launchCtx()})
	if err != nil || len(resp.Refusals) == 0 || resp.Refusals[0].Code != "capability_missing:decisions" {
		t.Fatalf("decisions: %v %v", err, resp.Refusals)
	}
}
