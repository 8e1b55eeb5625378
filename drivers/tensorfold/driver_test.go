// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// The test binary is also the launch shim of the engines it starts.
func TestMain(m *testing.M) {
	proc.MaybeRunShim()
	os.Exit(m.Run())
}

// newDriver is a driver whose system PATH and CUDA toolkit are empty, so
// that only the venv's tools count.
func newDriver(t *testing.T) *Driver {
	d := New()
	d.systemPath = t.TempDir()
	d.defaultCUDA = ""
	d.getenv = func(string) string { return "" }
	return d
}

// venv builds a fake TensorFold venv around the testkit's fake engine.
func venv(t *testing.T, version string, toolchain bool) string {
	t.Helper()
	_, fake := harness.Binaries(t)
	return harness.MakeTensorFoldVenv(t, filepath.Join(t.TempDir(), "tf"), fake, version, toolchain)
}

// modelDir is a checkpoint with one safetensors file of n bytes of weights.
func modelDir(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	hdr := fmt.Sprintf(`{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}`, n, n)
	b := make([]byte, 8+len(hdr)+n)
	binary.LittleEndian.PutUint64(b, uint64(len(hdr)))
	copy(b[8:], hdr)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"qwen3"}`), 0o644)
	return dir
}

func TestDetect(t *testing.T) {
	cases := []struct {
		name      string
		version   string
		toolchain bool
		verified  bool
		missing   []string
	}{
		{"verified with its tools", "0.6.6", true, true, nil},
		{"unverified 0.6.4", "0.6.4", true, false, nil},
		{"no build tools", "0.6.1", false, true, []string{"ninja", "nvcc", "c++"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := venv(t, c.version, c.toolchain)
			resp, err := newDriver(t).Detect(context.Background(), &sdk.DetectRequest{Path: v})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Family != Family || resp.Version != c.version || resp.Verified != c.verified ||
				resp.Program != filepath.Join(v, "bin", "tensorfold") || !strings.HasPrefix(resp.Digest, "sha256:") ||
				fmt.Sprint(resp.ToolchainMissing) != fmt.Sprint(c.missing) {
				t.Fatalf("detect %+v", resp)
			}
		})
	}
	t.Run("pip's nvcc and the toolkit count", func(t *testing.T) {
		v := venv(t, "0.6.6", false)
		nv := filepath.Join(v, "lib", "python3.12", "site-packages", "nvidia", "cu13", "bin")
		os.MkdirAll(nv, 0o755)
		os.WriteFile(filepath.Join(nv, "nvcc"), []byte("#!/bin/sh\n"), 0o755)
		cuda := t.TempDir()
		os.MkdirAll(filepath.Join(cuda, "bin"), 0o755)
		for _, tool := range []string{"nvcc", "ninja", "g++"} {
			os.WriteFile(filepath.Join(cuda, "bin", tool), []byte("#!/bin/sh\n"), 0o755)
		}
		d := newDriver(t)
		d.getenv = func(k string) string {
			if k == "CUDA_HOME" {
				return cuda
			}
			return ""
		}
		resp, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: v})
		if err != nil || len(resp.ToolchainMissing) != 0 || resp.Details[detailCUDAHome] != cuda || resp.Details[detailToolDirs] != nv {
			t.Fatalf("%+v %v", resp, err)
		}
	})
	t.Run("not a tensorfold venv", func(t *testing.T) {
		_, err := newDriver(t).Detect(context.Background(), &sdk.DetectRequest{Path: t.TempDir()})
		if sdk.CodeOf(err) != "engine_unsupported" {
			t.Fatalf("err = %v", err)
		}
	})
}

func deployment(dir string) *sdk.Deployment {
	return &sdk.Deployment{
		Name: "fold", Revision: 1, API: "chat", ServedName: "fold", ModelDir: dir, ContextLength: 16384,
		Resources: sdk.Resources{Declared: true, DeviceBytes: 20 << 30, HostBytes: 4 << 30},
	}
}

func installation(v string) *sdk.Installation {
	return &sdk.Installation{Name: "tensorfold", Family: Family, Path: v, Version: "0.6.6", Digest: "sha256:0123456789abcdef0123", Details: map[string]string{detailVenv: v}}
}

func TestPlan_Golden(t *testing.T) {
	v := "/opt/venvs/tensorfold"
	dir := modelDir(t, 4096)
	state := t.TempDir()
	launch := filepath.Join(state, "launches", "fold", "0-abc")
	cases := []struct {
		name string
		dep  func(*sdk.Deployment)
		host *sdk.HostPolicy
		lctx *sdk.LaunchContext
	}{
		{name: "declared", lctx: &sdk.LaunchContext{Port: 8200, LaunchDir: launch}},
		// The ledger granted 11.5 GiB on the card: that is the cap.
		{name: "granted-parallel-4", dep: func(d *sdk.Deployment) {
			d.MaxConcurrentRequests, d.KVCacheDtype = 4, "fp8"
			d.EngineConfigJSON = []byte(`{"max_tokens":4096,"thinking":false}`)
			d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--no-drafts"}
		}, host: &sdk.HostPolicy{CUDAHome: "/usr/local/cuda-13", EngineTelemetry: "allow"},
			lctx: &sdk.LaunchContext{Port: 8201, LaunchDir: launch, DeviceBytes: 23 << 29, DeviceUUIDs: []string{"GPU-1"}}},
		{name: "validate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := deployment(dir)
			if c.dep != nil {
				c.dep(dep)
			}
			d := New() // the real system PATH, as a launch renders it
			p, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *installation(v), Deployment: *dep, Host: drivertest.Value(c.host), Launch: drivertest.Value(c.lctx)})
			if err != nil || len(p.Refusals) > 0 {
				t.Fatalf("%v %v", err, p.Refusals)
			}
			drivertest.Golden(t, "plan-"+c.name, drivertest.RenderPlan(p, map[string]string{dir: "{{model_dir}}", state: "{{state_dir}}"}))
		})
	}
}

func TestPlan_Refusals(t *testing.T) {
	dir := modelDir(t, 4096)
	cases := []struct {
		name string
		dep  func(*sdk.Deployment)
		code string
	}{
		{"no resources", func(d *sdk.Deployment) { d.Resources = sdk.Resources{} }, "invalid_config"},
		{"no context", func(d *sdk.Deployment) { d.ContextLength = 0 }, "invalid_config"},
		{"parks deep", func(d *sdk.Deployment) { d.Residency = "deep" }, "capability_missing:deep_park"},
		{"decisions", func(d *sdk.Deployment) { d.API = "decisions" }, "capability_missing:decisions"},
		{"key variable", func(d *sdk.Deployment) { d.Env = map[string]string{"TENSORFOLD_API_KEY": "x"} }, "engine_env_reserved:TENSORFOLD_API_KEY"},
		{"cap variable", func(d *sdk.Deployment) { d.Env = map[string]string{"TENSORFOLD_CUDA_MEMORY_LIMIT_GB": "99"} }, "engine_env_reserved:TENSORFOLD_CUDA_MEMORY_LIMIT_GB"},
		{"key option", func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--api-key", "x"} }, "engine_option_reserved:--api-key"},
		{"metrics-open", func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--metrics-open"} }, "engine_option_reserved:--metrics-open"},
		{"parallel owned", func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--parallel", "2"} }, "engine_option_owned:--parallel"},
		{"drafter unapproved", func(d *sdk.Deployment) { d.AcceptExtraArgs, d.ExtraArgs = true, []string{"--drafter", "/tmp/d"} }, "engine_option_not_approved:--drafter"},
		{"unknown key", func(d *sdk.Deployment) { d.EngineConfigJSON = []byte(`{"speed":3}`) }, "unknown_config_key:engine_config.tensorfold.speed"},
		{"remote code", func(d *sdk.Deployment) { d.TrustRemoteCode = true }, "remote_code_not_allowed"},
		{"cap below the weights", func(d *sdk.Deployment) { d.Resources.DeviceBytes = 1024 }, "invalid_config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dep := deployment(dir)
			c.dep(dep)
			p, err := newDriver(t).Plan(context.Background(), &sdk.PlanRequest{Installation: *installation("/v"), Deployment: *dep, Host: sdk.HostPolicy{AllowRemoteCode: true}})
			if err != nil {
				t.Fatal(err)
			}
			codes := []string{}
			for _, r := range p.Refusals {
				codes = append(codes, r.Code)
			}
			if !contains(codes, c.code) || len(p.Argv) > 0 {
				t.Fatalf("refusals %v, want %s", p.Refusals, c.code)
			}
		})
	}
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func TestFlags(t *testing.T) {
	if err := Table.Validate(); err != nil {
		t.Fatal(err)
	}
	resp, _ := New().Flags(context.Background(), &sdk.FlagsRequest{})
	want := map[string]sdk.FlagClass{
		"TENSORFOLD_API_KEY": sdk.FlagClassReserved, "TENSORFOLD_CUDA_MEMORY_LIMIT_GB": sdk.FlagClassOwned,
		"--api-key": sdk.FlagClassReserved, "--metrics-open": sdk.FlagClassReserved, "--parallel": sdk.FlagClassOwned,
		"--no-drafts": sdk.FlagClassPassed, "--drafter": sdk.FlagClassGated,
	}
	got := map[string]sdk.FlagClass{}
	for _, r := range resp.Rules {
		got[r.Name] = r.Class
	}
	for n, c := range want {
		if got[n] != c {
			t.Fatalf("%s is %v, want %v", n, got[n], c)
		}
	}
}

// TestDriver_KernelBuildAndIdle runs the driver against the fake TensorFold:
// readiness waits for the first-request kernel build (during which /health
// reads busy), then the idle signal, then a stop that leaves nothing.
func TestDriver_KernelBuildAndIdle(t *testing.T) {
	d := newDriver(t)
	v := venv(t, "0.6.6", true)
	det, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: v})
	if err != nil {
		t.Fatal(err)
	}
	inst := &sdk.Installation{Name: "tensorfold", Family: Family, Path: v, Version: det.Version, Digest: det.Digest, Details: det.Details}
	built := filepath.Join(t.TempDir(), "kernels-built")
	host := &sdk.HostPolicy{HostEnv: map[string]string{"CAPYCTL_FAKE_KERNEL_BUILD_FILE": built}}
	dep := deployment(modelDir(t, 4096))
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: "fold/0", LaunchID: "l1"}
	plan, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host), Launch: *lctx})
	if err != nil || len(plan.Refusals) > 0 {
		t.Fatalf("plan %v %v", err, plan.Refusals)
	}
	resp, err := d.Start(context.Background(), &sdk.StartRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host), Launch: *lctx, Plan: *plan, EngineKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop(context.Background(), &sdk.StopRequest{InstanceID: "fold/0", Launch: &resp.Launch, Grace: 5 * time.Second})
	})
	if resp.Endpoint.AuthHeader != "" {
		t.Fatalf("TensorFold gets no key: %+v", &resp.Endpoint)
	}
	probed := make(chan *sdk.ProbeResponse, 1)
	go func() {
		p, _ := d.Probe(context.Background(), &sdk.ProbeRequest{InstanceID: "fold/0", Kind: sdk.ProbeKindReadiness, Deadline: 60 * time.Second})
		probed <- p
	}()
	load := func() *sdk.LoadResponse {
		l, err := d.Load(context.Background(), &sdk.LoadRequest{InstanceID: "fold/0"})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	harness.Eventually(t, 10*time.Second, "busy while the kernels build", func() bool { l := load(); return l.Known && l.Running == 1 })
	select {
	case p := <-probed:
		t.Fatalf("ready during the kernel build: %+v", p)
	default:
	}
	os.WriteFile(built, nil, 0o644)
	if p := <-probed; !p.Ready || p.Canary == "" {
		t.Fatalf("readiness %+v", p)
	}
	harness.Eventually(t, 10*time.Second, "idle", func() bool { l := load(); return l.Known && l.Running == 0 && l.Waiting == 0 })
	if _, err := d.Park(context.Background(), &sdk.ParkRequest{InstanceID: "fold/0"}); err != sdk.ErrNotSupported {
		t.Fatalf("park %v", err)
	}
	rec, err := New().Recover(context.Background(), &sdk.RecoverRequest{InstanceID: "fold/0", Launch: resp.Launch, Deployment: *dep})
	if err != nil || rec.State != sdk.RecoverStateRunning {
		t.Fatalf("recover %+v %v", rec, err)
	}
	stop, err := d.Stop(context.Background(), &sdk.StopRequest{InstanceID: "fold/0", Grace: 5 * time.Second})
	if err != nil || !stop.Gone || stop.ExitCode != 0 {
		t.Fatalf("stop %+v %v", stop, err)
	}
}

// TestDriver_DriftRefused: a venv that changed since it was registered is
// not started.
func TestDriver_DriftRefused(t *testing.T) {
	d := newDriver(t)
	v := venv(t, "0.6.6", true)
	inst := &sdk.Installation{Path: v, Digest: "sha256:other", Details: map[string]string{detailVenv: v}}
	_, err := d.Start(context.Background(), &sdk.StartRequest{Installation: *inst, Deployment: *deployment(t.TempDir()),
		Launch: sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir()}, Plan: sdk.PlanResponse{Argv: []string{"x"}}})
	if sdk.CodeOf(err) != "installation_drift" {
		t.Fatalf("err = %v", err)
	}
}
