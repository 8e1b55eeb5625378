// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/proc"
)

// The test binary is also the launch shim of the engines it starts.
func TestMain(m *testing.M) {
	proc.MaybeRunShim()
	os.Exit(m.Run())
}

// storiesGGUF is the real tiny model (sdk/formats/testdata).
var storiesGGUF, _ = filepath.Abs("../../sdk/formats/testdata/stories260K.gguf")

// modelDir makes a model directory holding stories260K.gguf (linked).
func modelDir(t *testing.T, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(storiesGGUF, filepath.Join(dir, "stories260K.gguf")); err != nil {
		t.Fatal(err)
	}
	for _, f := range extra {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSize_Stories260K derives the memory of stories260K.gguf from its
// header, by hand:
//
//	weights     292,800 F32 parameters × 4 B                  = 1,171,200 B
//	KV / token  5 layers × (4 KV heads × 8 dims) × (K + V) × 2 B (F16) = 640 B
//	context     n_ctx_train 2048 (a multiple of 256) a slot; 4 slots: -c 8192
//	KV cache    8192 tokens × 640 B                            = 5,242,880 B (5 MiB)
//	card        1,171,200 + 5,242,880                          = 6,414,080 B
//	host RAM    llama-server's own 256 MiB                     = 268,435,456 B
func TestSize_Stories260K(t *testing.T) {
	dir := modelDir(t)
	s, err := Size(SizeInput{Dir: dir, GPULayers: -1})
	if err != nil {
		t.Fatal(err)
	}
	want := Sizing{
		File: filepath.Join(dir, "stories260K.gguf"), Parts: []string{filepath.Join(dir, "stories260K.gguf")},
		Architecture: "llama", TrainContext: 2048, Layers: 5, Context: 2048, Slots: 4, CtxSize: 8192, GPULayers: 5, KVType: "f16",
		WeightsBytes: 1_171_200, DeviceWeights: 1_171_200, KVBytesPerToken: 640, KVCacheBytes: 5_242_880, DeviceKV: 5_242_880,
	}
	if fmt.Sprint(*s) != fmt.Sprint(want) {
		t.Fatalf("sizing\n got %+v\nwant %+v", *s, want)
	}
	if s.ReadyDeviceBytes() != 6_414_080 || s.ReadyHostBytes() != 268_435_456 {
		t.Fatalf("ready %d on the card, %d in host RAM", s.ReadyDeviceBytes(), s.ReadyHostBytes())
	}
	cases := []struct {
		name                    string
		in                      SizeInput
		ctx, kvPerToken, kv     int64
		deviceWeights, deviceKV int64
	}{
		// q8_0: 32 elements in 34 bytes: 5 × 2 × 34 = 340 B a token.
		{"q8_0 cache, 1 slot", SizeInput{Slots: 1, KVType: "q8_0", GPULayers: -1}, 2048, 340, 2048 * 340, 1_171_200, 2048 * 340},
		// 1000 tokens round up to 1024.
		{"context padded", SizeInput{Context: 1000, Slots: 2, GPULayers: -1}, 1024, 640, 2048 * 640, 1_171_200, 2048 * 640},
		// Two of five layers on the card: blk.3 and blk.4, 181,760 B each
		// (q 16384 + k 8192 + v 8192 + o 16384 + gate, up, down 3 × 44032
		// + two norms 2 × 256), and 2/5 of the KV cache.
		{"two layers offloaded", SizeInput{GPULayers: 2}, 2048, 640, 5_242_880, 363_520, 2_097_152},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.Dir = dir
			s, err := Size(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if s.Context != c.ctx || s.KVBytesPerToken != c.kvPerToken || s.KVCacheBytes != c.kv || s.DeviceWeights != c.deviceWeights || s.DeviceKV != c.deviceKV {
				t.Fatalf("got %+v", *s)
			}
			if s.HostWeights+s.DeviceWeights != 1_171_200 {
				t.Fatalf("weights split %d + %d", s.DeviceWeights, s.HostWeights)
			}
		})
	}
}

func TestSize_Refusals(t *testing.T) {
	stories := func(t *testing.T) string { return modelDir(t) }
	cases := []struct {
		name string
		dir  func(t *testing.T) string
		in   SizeInput
		want string
	}{
		{"no gguf", func(t *testing.T) string { return t.TempDir() }, SizeInput{}, "holds no .gguf"},
		{"two models", func(t *testing.T) string {
			d := modelDir(t)
			os.Symlink(storiesGGUF, filepath.Join(d, "other.gguf"))
			return d
		}, SizeInput{}, "name one with engine_config.llamacpp.gguf_file"},
		{"escaping name", stories, SizeInput{File: "../x.gguf"}, "leaves the model directory"},
		{"absolute name", stories, SizeInput{File: "/etc/passwd"}, "inside the model directory"},
		{"missing file", stories, SizeInput{File: "nope.gguf"}, "no such file"},
		{"not gguf", func(t *testing.T) string {
			d := t.TempDir()
			os.WriteFile(filepath.Join(d, "m.gguf"), []byte("not a model at all, really"), 0o644)
			return d
		}, SizeInput{}, "not a GGUF file"},
		{"bad cache type", stories, SizeInput{KVType: "q2_k"}, "not a llama.cpp cache type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.Dir = c.dir(t)
			if _, err := Size(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	// The projector and the other parts of a split model are not candidates.
	d := modelDir(t, "mmproj-f16.gguf")
	if s, err := Size(SizeInput{Dir: d, GPULayers: -1}); err != nil || filepath.Base(s.File) != "stories260K.gguf" {
		t.Fatalf("with a projector beside it: %v", err)
	}
}

// deployment is a chat deployment of stories260K.
func deployment(dir string) *sdk.Deployment {
	return &sdk.Deployment{Name: "stories", Revision: 1, API: "chat", ServedName: "stories", ModelDir: dir}
}

func installation(path string) *sdk.Installation {
	return &sdk.Installation{Name: "llamacpp", Family: Family, Path: path, Version: "0.7.0"}
}

// newDriver is a driver that never finds a system configuration file.
func newDriver() *Driver {
	d := New()
	d.systemConfig = ""
	d.stopGrace = 5 * time.Second
	return d
}

func TestPlan_Golden(t *testing.T) {
	dir := modelDir(t)
	launch := t.TempDir()
	cases := []struct {
		name string
		dep  func(*sdk.Deployment)
		host *sdk.HostPolicy
		lctx *sdk.LaunchContext
	}{
		{name: "chat", lctx: &sdk.LaunchContext{Port: 8123, LaunchDir: launch}},
		{name: "validate", lctx: nil}, // at deploy time: no port, no launch directory yet
		{name: "decisions-q8-one-slot", dep: func(d *sdk.Deployment) {
			d.API, d.ServedName = "decisions", "judge"
			d.MaxConcurrentRequests, d.ContextLength, d.KVCacheDtype = 1, 4096, "q8_0"
			d.EngineConfigJSON = []byte(`{"gguf_file":"stories260K.gguf","n_gpu_layers":3}`)
			d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--batch-size", "4096", "--ubatch-size", "4096"}
		}, host: &sdk.HostPolicy{EngineTelemetry: "allow", HostEnv: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1234"}, ApprovedEnv: []string{"GGML_*"}},
			lctx: &sdk.LaunchContext{Port: 8124, LaunchDir: launch}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := deployment(dir)
			if c.dep != nil {
				c.dep(dep)
			}
			p, err := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/opt/llama/bin/llama-server"), Deployment: *dep, Host: drivertest.Value(c.host), Launch: drivertest.Value(c.lctx)})
			if err != nil || len(p.Refusals) > 0 {
				t.Fatalf("plan: %v %v", err, p.Refusals)
			}
			drivertest.Golden(t, "plan-"+c.name, drivertest.RenderPlan(p, map[string]string{dir: "{{model_dir}}", launch: "{{launch_dir}}"}))
		})
	}
}

// TestPlan_OffloadHints: the memory hints follow n_gpu_layers, from the
// header of stories260K.gguf (TestSize_Stories260K): all layers on the
// card; none (host RAM only, no startup figure on the card, the cards
// hidden); two of five (blk.3 and blk.4, 363,520 B, and 2/5 of the
// 5,242,880 B KV cache on the card, the rest in host RAM).
func TestPlan_OffloadHints(t *testing.T) {
	const overhead = HostOverheadBytes
	cases := []struct {
		name, layers, ngl string
		device, host      int64
		hidden            bool
	}{
		{name: "all", layers: `"all"`, ngl: "6", device: 6_414_080, host: overhead},
		{name: "none", layers: `0`, ngl: "0", device: 0, host: overhead + 1_171_200 + 5_242_880, hidden: true},
		{name: "two of five", layers: `2`, ngl: "2", device: 363_520 + 2_097_152, host: overhead + 807_680 + 3_145_728},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := deployment(modelDir(t))
			dep.EngineConfigJSON = []byte(`{"n_gpu_layers":` + c.layers + `}`)
			p, err := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/opt/llama/bin/llama-server"), Deployment: *dep,
				Launch: sdk.LaunchContext{Port: 8080, LaunchDir: t.TempDir()}})
			if err != nil || len(p.Refusals) > 0 {
				t.Fatalf("plan: %v %v", err, p.Refusals)
			}
			h := &p.Hints
			if h.ReadyDeviceBytes != c.device || h.StartupDeviceBytes != c.device || h.ReadyHostBytes != c.host || h.WeightsBytes != 1_171_200 {
				t.Fatalf("hints %+v, want %d on the card and %d in host RAM", h, c.device, c.host)
			}
			if argv := strings.Join(p.Argv, " "); !strings.Contains(argv, "--n-gpu-layers "+c.ngl+" ") {
				t.Fatalf("argv %s, want --n-gpu-layers %s", argv, c.ngl)
			}
			if v, ok := p.Env["CUDA_VISIBLE_DEVICES"]; ok != c.hidden || v != "" {
				t.Fatalf("CUDA_VISIBLE_DEVICES = %q (set %v), want hidden %v", v, ok, c.hidden)
			}
		})
	}
}

// TestPlan_OlderBuild: a build whose --help lacks the newer hardening flags
// (b4748 has no --fit, --cache-ram, --offline, --no-webui or kv-unified)
// gets none of them; the flags CapyCTL needs are always rendered.
func TestPlan_OlderBuild(t *testing.T) {
	inst := installation("/opt/llama/b4748/llama-server")
	inst.Version = "b4748"
	inst.Details = map[string]string{detailOptions: "--alias --cache-type-k --cache-type-v --ctx-size --host --metrics --model --n-gpu-layers --no-context-shift --parallel --port --slots"}
	p, err := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: *deployment(modelDir(t)), Launch: sdk.LaunchContext{Port: 8080}})
	if err != nil || len(p.Refusals) > 0 {
		t.Fatalf("%v %v", err, p.Refusals)
	}
	argv := strings.Join(p.Argv, " ")
	for _, absent := range []string{"--fit", "--cache-ram", "--offline", "--no-webui", "--no-kv-unified"} {
		if strings.Contains(argv, absent) {
			t.Fatalf("%s rendered for a build without it: %s", absent, argv)
		}
	}
	for _, present := range []string{"--no-context-shift", "--metrics", "--slots", "--ctx-size 8192", "--parallel 4", "--n-gpu-layers 6"} {
		if !strings.Contains(argv, present) {
			t.Fatalf("%s missing: %s", present, argv)
		}
	}
}

func TestPlan_Refusals(t *testing.T) {
	dir := modelDir(t)
	cases := []struct {
		name string
		dep  func(*sdk.Deployment)
		inst func(*sdk.Installation)
		host *sdk.HostPolicy
		code string
	}{
		{name: "parks deep", dep: func(d *sdk.Deployment) { d.Residency = "deep" }, code: "capability_missing:deep_park"},
		{name: "host backed", dep: func(d *sdk.Deployment) { d.Residency = "host_backed" }, code: "capability_missing:deep_park"},
		{name: "decisions on 0.6.0", dep: func(d *sdk.Deployment) { d.API = "decisions" }, inst: func(i *sdk.Installation) { i.Version = "0.6.0" }, code: "capability_missing:decisions"},
		{name: "decisions on a build number", dep: func(d *sdk.Deployment) { d.API = "decisions" }, inst: func(i *sdk.Installation) { i.Version = "b4748" }, code: "capability_missing:decisions"},
		{name: "unknown key", dep: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"threads":8}`) }, code: "unknown_config_key:threads"},
		{name: "a group", dep: func(d *sdk.Deployment) {
			d.Group = &sdk.Group{Rank: 0, Size: 2, TensorParallel: 2, PipelineParallel: 1, HeadAddress: "10.0.0.1", RendezvousPort: 25000, PeerAddress: "10.0.0.1"}
		}, code: "group_shape_unsupported:llamacpp"},
		{name: "bad gpu layers", dep: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"n_gpu_layers":"most"}`) }, code: "invalid_config"},
		{name: "remote code", dep: func(d *sdk.Deployment) { d.TrustRemoteCode = true }, code: "remote_code_not_allowed"},
		{name: "dtype", dep: func(d *sdk.Deployment) { d.Dtype = "bfloat16" }, code: "invalid_config"},
		{name: "kv cache size", dep: func(d *sdk.Deployment) { d.Memory = sdk.MemorySizes{KVCacheBytes: 1 << 30} }, code: "invalid_config"},
		{name: "bad cache type", dep: func(d *sdk.Deployment) { d.KVCacheDtype = "fp8" }, code: "checkpoint_unusable"},
		{name: "escaping gguf", dep: func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"gguf_file":"../../etc/x.gguf"}`) }, code: "checkpoint_unusable"},
		{name: "extra args not accepted", dep: func(d *sdk.Deployment) { d.ExtraArgs = []string{"--threads", "4"} }, code: "extra_args_not_accepted"},
		{name: "reserved option", dep: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--api-key", "x"} }, code: "engine_option_reserved:--api-key"},
		{name: "reserved pattern", dep: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--hf-repo=org/x"} }, code: "engine_option_reserved:--hf-repo"},
		{name: "owned option", dep: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--ctx-size", "100"} }, code: "engine_option_owned:--ctx-size"},
		{name: "owned negation", dep: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--no-metrics"} }, code: "engine_option_owned:--metrics"},
		{name: "short option", dep: func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"-c", "100"} }, code: "engine_option_reserved:-c"},
		{name: "unapproved path", dep: func(d *sdk.Deployment) {
			d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--lora", "/tmp/adapter.gguf"}
		}, host: &sdk.HostPolicy{ApprovedPaths: []string{"/srv/adapters"}}, code: "engine_option_not_approved:--lora"},
		{name: "reserved env", dep: func(d *sdk.Deployment) { d.Env = map[string]string{"LLAMA_ARG_HOST": "0.0.0.0"} }, host: &sdk.HostPolicy{ApprovedEnv: []string{"*"}}, code: "engine_env_reserved:LLAMA_ARG_HOST"},
		{name: "key env", dep: func(d *sdk.Deployment) { d.Env = map[string]string{"LLAMA_API_KEY": "x"} }, host: &sdk.HostPolicy{ApprovedEnv: []string{"*"}}, code: "engine_env_reserved:LLAMA_API_KEY"},
		{name: "unapproved env", dep: func(d *sdk.Deployment) { d.Env = map[string]string{"GGML_CUDA_NO_PINNED": "1"} }, code: "engine_env_not_approved:GGML_CUDA_NO_PINNED"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep, inst := deployment(dir), installation("/opt/llama-server")
			if c.dep != nil {
				c.dep(dep)
			}
			if c.inst != nil {
				c.inst(inst)
			}
			p, err := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(c.host)})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Refusals) == 0 || p.Refusals[0].Code != c.code {
				t.Fatalf("refusals %v, want %s first", p.Refusals, c.code)
			}
			if len(p.Argv) > 0 {
				t.Fatalf("a refused plan rendered %v", p.Argv)
			}
		})
	}
	t.Run("approved path passes", func(t *testing.T) {
		dep := deployment(dir)
		dep.AcceptExtraArgs, dep.ExtraArgs = true, []string{"--lora", "/srv/adapters/a.gguf"}
		p, _ := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/x/llama-server"), Deployment: *dep, Host: sdk.HostPolicy{ApprovedPaths: []string{"/srv/adapters"}}})
		if len(p.Refusals) != 0 || p.Argv[len(p.Argv)-1] != "/srv/adapters/a.gguf" {
			t.Fatalf("refusals %v argv %v", p.Refusals, p.Argv)
		}
	})
	t.Run("a host llama.cpp configuration", func(t *testing.T) {
		d := newDriver()
		d.systemConfig = filepath.Join(t.TempDir(), "config.ini")
		os.WriteFile(d.systemConfig, nil, 0o644)
		p, _ := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/x/llama-server"), Deployment: *deployment(dir)})
		if len(p.Refusals) != 1 || p.Refusals[0].Code != enginekit.CodeEngineUnsupported {
			t.Fatalf("refusals %v", p.Refusals)
		}
	})
}

func TestFlags_Table(t *testing.T) {
	resp, err := newDriver().Flags(context.Background(), &sdk.FlagsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	byName := map[string]*sdk.FlagRule{}
	for _, r := range resp.Rules {
		for _, n := range append([]string{r.Name}, r.Aliases...) {
			key := r.Kind.String() + n
			if seen[key] {
				t.Fatalf("%s listed twice", n)
			}
			seen[key] = true
			if r.Kind == sdk.FlagKindOption && !strings.HasPrefix(n, "--") {
				t.Fatalf("option %q is not a long option", n)
			}
		}
		if r.Reason == "" || (r.Class == sdk.FlagClassGated) != (r.Approval != "") {
			t.Fatalf("rule %v", r)
		}
		byName[r.Name] = r
	}
	want := map[string]sdk.FlagClass{
		"--api-key": sdk.FlagClassReserved, "--ctx-size": sdk.FlagClassOwned, "--parallel": sdk.FlagClassOwned,
		"--offline": sdk.FlagClassOwned, "--sleep-idle-seconds": sdk.FlagClassReserved, "--model-draft": sdk.FlagClassGated,
		"--batch-size": sdk.FlagClassPassed, "LLAMA_ARG_*": sdk.FlagClassReserved, "LLAMA_API_KEY": sdk.FlagClassOwned,
	}
	for n, c := range want {
		if r := byName[n]; r == nil || r.Class != c {
			t.Fatalf("%s: %v, want %s", n, r, c)
		}
	}
	// Every option the plan renders is one CapyCTL owns.
	p, _ := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/x/llama-server"), Deployment: *deployment(modelDir(t))})
	for _, a := range p.Argv[1:] {
		if strings.HasPrefix(a, "--") {
			if c := Table.ResolveOption(a).Class(flags.Option); c != flags.Owned {
				t.Fatalf("rendered %s is %s, not owned", a, c)
			}
		}
	}
	if err := Table.Validate(); err != nil {
		t.Fatal(err)
	}
}

// fakeLlama installs the testkit's fake engine as a llama-server binary.
func fakeLlama(t *testing.T) string {
	t.Helper()
	_, fake := harness.Binaries(t)
	p := filepath.Join(t.TempDir(), "bin", "llama-server")
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.Symlink(fake, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDetect(t *testing.T) {
	llama := fakeLlama(t)
	d := newDriver()
	resp, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: llama})
	if err != nil {
		t.Fatal(err)
	}
	_, fake := harness.Binaries(t)
	digest, _ := enginekit.FileDigest(fake)
	if resp.Family != Family || resp.Version != "0.7.0" || resp.Verified || resp.Digest != digest || resp.Program != llama || resp.Details["commit"] != "c392e5094" {
		t.Fatalf("detect %+v", resp)
	}
	// The build's options come from its --help.
	for _, o := range []string{"--fit", "--cache-ram", "--no-kv-unified", "--offline", "--ctx-size"} {
		if !strings.Contains(" "+resp.Details[detailOptions]+" ", " "+o+" ") {
			t.Fatalf("options %q lack %s", resp.Details[detailOptions], o)
		}
	}
	// The build binds a Unix socket for a --host ending in .sock: its
	// --help says so.
	if resp.Details[detailUnixSocket] != "true" {
		t.Fatalf("details %v: the fake's --help names the .sock host form", resp.Details)
	}
	scripts := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(scripts, name)
		os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755)
		return p
	}
	cases := []struct {
		name, path, code string
	}{
		{"a directory", scripts, enginekit.CodeEngineUnsupported},
		{"another program", write("vllm", "echo hi"), enginekit.CodeEngineUnsupported},
		{"missing", filepath.Join(scripts, "llama-server-x"), enginekit.CodeEngineUnsupported},
		{"no version line", write("llama-server-odd", "echo hello >&2"), codeVersionFailed},
		{"fails", write("llama-server-bad", "exit 3"), codeVersionFailed},
		{"build number", write("llama-server-b", "echo 'version: 4748 (c392e5094)' >&2"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: c.path})
			if c.code == "" {
				if err != nil || resp.Version != "b4748" || !strings.Contains(strings.Join(resp.Notes, "\n"), "chat only") ||
					resp.Details[detailUnixSocket] != "" || !strings.Contains(strings.Join(resp.Notes, "\n"), "cannot listen on a Unix socket") {
					t.Fatalf("%+v %v", resp, err)
				}
				return
			}
			if sdk.CodeOf(err) != c.code {
				t.Fatalf("err = %v, want %s", err, c.code)
			}
		})
	}
	t.Run("a build from a source tarball is an unknown build", func(t *testing.T) {
		p := write("llama-server-tarball", "echo 'version: 0 (unknown)' >&2\necho 'built with cc for x86_64-linux-gnu' >&2")
		resp, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: p})
		if err != nil || resp.Version != UnknownBuild || resp.Details["commit"] != "" ||
			!strings.Contains(strings.Join(resp.Notes, "\n"), "does not say which llama.cpp it is") {
			t.Fatalf("%+v %v", resp, err)
		}
	})
	t.Run("the environment is cleared", func(t *testing.T) {
		t.Setenv("SECRET_OF_THE_CORE", "x")
		p := write("llama-server-env", `echo "version: 1.0.0 ($(env | grep -c SECRET_OF_THE_CORE)00)" >&2`)
		resp, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: p})
		if err != nil || resp.Details["commit"] != "000" {
			t.Fatalf("%+v %v", resp, err)
		}
	})
}

// started is a llama-server the driver launched.
type started struct {
	d    *Driver
	id   string
	resp *sdk.StartResponse
	plan *sdk.PlanResponse
}

// start plans and starts dep on the fake llama-server; beforeStart runs
// between the plan and the start.
func start(t *testing.T, d *Driver, dep *sdk.Deployment, host *sdk.HostPolicy, beforeStart ...func()) *started {
	t.Helper()
	inst := installation(fakeLlama(t))
	det, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: inst.Path})
	if err != nil {
		t.Fatal(err)
	}
	inst.Digest = det.Digest
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: dep.Name + "/0", LaunchID: "l1"}
	plan, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host), Launch: *lctx})
	if err != nil || len(plan.Refusals) > 0 {
		t.Fatalf("plan: %v %v", err, plan.Refusals)
	}
	for _, f := range beforeStart {
		f()
	}
	resp, err := d.Start(context.Background(), &sdk.StartRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host), Launch: *lctx, Plan: *plan, EngineKey: "engine-key-123"})
	if err != nil {
		t.Fatal(err)
	}
	s := &started{d: d, id: lctx.InstanceID, resp: resp, plan: plan}
	t.Cleanup(func() {
		d.Stop(context.Background(), &sdk.StopRequest{InstanceID: s.id, Launch: &resp.Launch, Grace: 5 * time.Second})
	})
	return s
}

func (s *started) probe(t *testing.T, kind sdk.ProbeKind) *sdk.ProbeResponse {
	t.Helper()
	p, err := s.d.Probe(context.Background(), &sdk.ProbeRequest{InstanceID: s.id, Kind: kind, Deadline: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// post sends a body to the endpoint with its auth.
func post(t *testing.T, ep *sdk.Endpoint, path, body string, stream bool) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, ep.BaseURL+path, strings.NewReader(body))
	req.Header.Set(ep.AuthHeader, ep.AuthValue)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestDriver_ChatLifecycle runs the driver against the fake llama-server:
// start, ready (health, models, props, a real answer), serve, the idle
// signal, logs, stop with exit 134, and nothing left.
func TestDriver_ChatLifecycle(t *testing.T) {
	d := newDriver()
	// Answers run long (the probe's 8 tokens take 80 ms), so that two
	// requests on one slot are one running and one waiting.
	host := &sdk.HostPolicy{HostEnv: map[string]string{"CAPYCTL_FAKE_TOKENS": "1000000", "CAPYCTL_FAKE_TOKEN_RATE": "100"}}
	dep := deployment(modelDir(t))
	dep.MaxConcurrentRequests = 1
	s := start(t, d, dep, host)
	if ep := &s.resp.Endpoint; ep.AuthValue != "Bearer engine-key-123" || ep.DecisionsPath != "/v1/systemone" || ep.ServedName != "stories" ||
		ep.NonStreamedHangup != sdk.NonStreamedHangupStream {
		t.Fatalf("endpoint %+v", ep)
	}
	ready := s.probe(t, sdk.ProbeKindReadiness)
	if !ready.Ready || ready.Canary == "" {
		t.Fatalf("readiness %+v", ready)
	}
	if live := s.probe(t, sdk.ProbeKindLiveness); !live.Alive {
		t.Fatalf("liveness %+v", live)
	}
	load := func() *sdk.LoadResponse {
		l, err := d.Load(context.Background(), &sdk.LoadRequest{InstanceID: s.id})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := load(); !l.Known || l.Running != 0 || l.Waiting != 0 {
		t.Fatalf("idle load %+v", l)
	}
	// One slot: a long stream runs, a second waits.
	ep := &s.resp.Endpoint
	body := `{"model":"stories","stream":true,"messages":[{"role":"user","content":"Once upon a time"}]}`
	a := post(t, ep, ep.ChatPath, body, true)
	line, _ := bufio.NewReader(a.Body).ReadString('\n')
	if !strings.Contains(line, `"content"`) {
		t.Fatalf("first event %q", line)
	}
	ctx, hangUp := context.WithCancel(context.Background())
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ep.BaseURL+ep.ChatPath, strings.NewReader(body))
		req.Header.Set(ep.AuthHeader, ep.AuthValue)
		if b, err := http.DefaultClient.Do(req); err == nil {
			b.Body.Close()
		}
	}()
	harness.Eventually(t, 10*time.Second, "one running, one waiting", func() bool {
		l := load()
		return l.Running == 1 && l.Waiting == 1
	})
	// Both clients hang up: llama-server frees the slot and the queue.
	a.Body.Close()
	hangUp()
	harness.Eventually(t, 10*time.Second, "idle after the hang-ups", func() bool {
		l := load()
		return l.Running == 0 && l.Waiting == 0
	})
	logs, err := d.Logs(context.Background(), &sdk.LogsRequest{InstanceID: s.id})
	if err != nil || !strings.Contains(logs.Text, "listening on 127.0.0.1:") || strings.Contains(logs.Text, "engine-key-123") {
		t.Fatalf("logs %v %q", err, logs.Text)
	}
	stop, err := d.Stop(context.Background(), &sdk.StopRequest{InstanceID: s.id, Grace: 5 * time.Second})
	if err != nil || !stop.Gone || stop.ExitCode != 134 || stop.Forced {
		t.Fatalf("stop %+v %v", stop, err)
	}
	if _, err := d.Probe(context.Background(), &sdk.ProbeRequest{InstanceID: s.id, Kind: sdk.ProbeKindLiveness}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("probe after stop: %v", err)
	}
}

// TestDriver_DecisionsReadiness: a decisions deployment is proven ready by
// the readiness decision, never a chat request.
func TestDriver_DecisionsReadiness(t *testing.T) {
	d := newDriver()
	dep := deployment(modelDir(t))
	dep.API, dep.ServedName = "decisions", "judge"
	s := start(t, d, dep, nil)
	ready := s.probe(t, sdk.ProbeKindReadiness)
	if !ready.Ready || !strings.HasPrefix(ready.Canary, "yes=") {
		t.Fatalf("readiness %+v", ready)
	}
	ep := &s.resp.Endpoint
	resp := post(t, ep, ep.DecisionsPath, `{"model":"judge","state":"s","questions":[{"id":"q","type":"noul","text":"t?"}]}`, false)
	var ans struct {
		Answers []struct {
			Probabilities map[string]float64 `json:"probabilities"`
		} `json:"answers"`
	}
	json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(ans.Answers) != 1 || len(ans.Answers[0].Probabilities) != 3 {
		t.Fatalf("decision %d %+v", resp.StatusCode, ans)
	}
	// The fake's stats show no chat request was ever sent.
	req, _ := http.NewRequest("GET", ep.BaseURL+"/fake/stats", nil)
	req.Header.Set(ep.AuthHeader, ep.AuthValue)
	st, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct{ Total int }
	json.NewDecoder(st.Body).Decode(&stats)
	st.Body.Close()
	if stats.Total != 0 {
		t.Fatalf("%d chat requests reached a decision model", stats.Total)
	}
}

// TestDriver_FailedLoad: a model that breaks between the plan and the
// start makes llama-server exit 134 at once; readiness says so with its
// last log lines instead of waiting out the deadline.
func TestDriver_FailedLoad(t *testing.T) {
	d := newDriver()
	dir := t.TempDir()
	raw, _ := os.ReadFile(storiesGGUF)
	model := filepath.Join(dir, "stories260K.gguf")
	os.WriteFile(model, raw, 0o644)
	s := start(t, d, deployment(dir), nil, func() {
		// The plan read a good header; the file is cut before the start.
		os.WriteFile(model, raw[:len(raw)/2], 0o644)
	})
	p := s.probe(t, sdk.ProbeKindReadiness)
	if p.Ready || !p.Exited || p.ExitCode != 134 || p.Code != sdk.CodeLaunchFailed || !strings.Contains(strings.Join(p.LastLogLines, "\n"), "error loading model") {
		t.Fatalf("probe %+v", p)
	}
}

// TestDriver_Recover: a fresh driver re-attaches to a running llama-server
// from the recorded launch, serves it and stops it.
func TestDriver_Recover(t *testing.T) {
	d := newDriver()
	dep := deployment(modelDir(t))
	s := start(t, d, dep, nil)
	if p := s.probe(t, sdk.ProbeKindReadiness); !p.Ready {
		t.Fatalf("readiness %+v", p)
	}
	fresh := newDriver()
	rec, err := fresh.Recover(context.Background(), &sdk.RecoverRequest{InstanceID: s.id, Launch: s.resp.Launch, Deployment: *dep, EngineKey: "engine-key-123"})
	if err != nil || rec.State != sdk.RecoverStateRunning || rec.Endpoint.AuthValue != "Bearer engine-key-123" {
		t.Fatalf("recover %+v %v", rec, err)
	}
	if p, err := fresh.Probe(context.Background(), &sdk.ProbeRequest{InstanceID: s.id, Kind: sdk.ProbeKindReadiness, Deadline: 10 * time.Second}); err != nil || !p.Ready {
		t.Fatalf("readiness after recover %+v %v", p, err)
	}
	stop, err := fresh.Stop(context.Background(), &sdk.StopRequest{InstanceID: s.id, Grace: 5 * time.Second})
	if err != nil || !stop.Gone {
		t.Fatalf("stop %+v %v", stop, err)
	}
	rec, _ = newDriver().Recover(context.Background(), &sdk.RecoverRequest{InstanceID: s.id, Launch: s.resp.Launch})
	if rec.State != sdk.RecoverStateGone {
		t.Fatalf("recover after stop %+v", rec)
	}
}

func TestDriver_StartRefusals(t *testing.T) {
	d := newDriver()
	dep := deployment(modelDir(t))
	inst := installation(fakeLlama(t))
	inst.Digest = "sha256:0000"
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: "stories/0"}
	plan, _ := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Launch: *lctx})
	if _, err := d.Start(context.Background(), &sdk.StartRequest{Installation: *inst, Deployment: *dep, Launch: *lctx, Plan: *plan}); sdk.CodeOf(err) != enginekit.CodeInstallationDrift {
		t.Fatalf("a changed binary: %v", err)
	}
	inst.Digest = ""
	ln, _ := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lctx.Port))
	defer ln.Close()
	if _, err := d.Start(context.Background(), &sdk.StartRequest{Installation: *inst, Deployment: *dep, Launch: *lctx, Plan: *plan}); sdk.CodeOf(err) != enginekit.CodePortConflict {
		t.Fatalf("a taken port: %v", err)
	}
	if _, err := d.Park(context.Background(), &sdk.ParkRequest{}); err != sdk.ErrNotSupported {
		t.Fatalf("park: %v", err)
	}
	if desc, _ := d.Describe(context.Background(), &sdk.DescribeRequest{}); len(desc.Capabilities.ParkTiers) != 0 || !desc.Capabilities.IdleSignal {
		t.Fatalf("describe %+v", desc)
	}
}

// TestPlan_Embeddings: an embeddings deployment is started with
// --embeddings (llama-server answers /v1/embeddings only then); a chat one
// without.
func TestPlan_Embeddings(t *testing.T) {
	dir := modelDir(t)
	for _, api := range []string{"chat", "embeddings"} {
		dep := deployment(dir)
		dep.API = api
		p, err := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/opt/llama/bin/llama-server"), Deployment: *dep, Launch: sdk.LaunchContext{Port: 8080}})
		if err != nil || len(p.Refusals) > 0 {
			t.Fatalf("%s: %v %v", api, err, p.Refusals)
		}
		if got := strings.Contains(strings.Join(p.Argv, " ")+" ", " --embeddings "); got != (api == "embeddings") {
			t.Fatalf("%s: --embeddings %v: %v", api, got, p.Argv)
		}
	}
}

// TestPlan_Rerank: a rerank deployment is started with --reranking
// (llama-server answers /v1/rerank only then) and without --embeddings;
// the other apis without --reranking. Describe lists rerank.
func TestPlan_Rerank(t *testing.T) {
	dir := modelDir(t)
	for _, api := range []string{"chat", "embeddings", "rerank"} {
		dep := deployment(dir)
		dep.API = api
		p, err := newDriver().Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/opt/llama/bin/llama-server"), Deployment: *dep, Launch: sdk.LaunchContext{Port: 8080}})
		if err != nil || len(p.Refusals) > 0 {
			t.Fatalf("%s: %v %v", api, err, p.Refusals)
		}
		argv := strings.Join(p.Argv, " ") + " "
		if got := strings.Contains(argv, " --reranking "); got != (api == "rerank") {
			t.Fatalf("%s: --reranking %v: %v", api, got, p.Argv)
		}
		if got := strings.Contains(argv, " --embeddings "); got != (api == "embeddings") {
			t.Fatalf("%s: --embeddings %v: %v", api, got, p.Argv)
		}
	}
	desc, _ := newDriver().Describe(context.Background(), &sdk.DescribeRequest{})
	if got := strings.Join(desc.Capabilities.APIs, ","); got != "chat,decisions,embeddings,rerank" {
		t.Fatalf("apis %s", got)
	}
}
