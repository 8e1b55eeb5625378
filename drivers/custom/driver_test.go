// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"context"
	"fmt"
	"os"
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

// testManifest is the testkit's manifest of the fake engine, with env
// values that use placeholders and the key.
func testManifest() string {
	return harness.FakeManifest() + `env = { LISTEN = "{{host}}:{{port}}", STATE = "{{launch_dir}}/state", TOKEN = "key={{engine_key}}" }` + "\n"
}

// fakeProgram registers the testkit's fake engine as a custom program.
func fakeProgram(t *testing.T) (*Driver, *sdk.Installation) {
	t.Helper()
	_, fake := harness.Binaries(t)
	d := New()
	det, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: fake, Manifest: testManifest()})
	if err != nil {
		t.Fatal(err)
	}
	return d, &sdk.Installation{Name: "fake", Family: Family, Path: fake, Version: det.Version, Digest: det.Digest, Details: det.Details}
}

// TestPlan_Golden renders the manifest's command and environment: the
// placeholders filled, the key kept out of the plan, the host's and the
// deployment's variables, the declared memory.
func TestPlan_Golden(t *testing.T) {
	d, inst := fakeProgram(t)
	host := &sdk.HostPolicy{HostEnv: map[string]string{"HOST_VAR": "1"}, ApprovedEnv: []string{"APP_*"}}
	cases := []struct {
		name string
		dep  *sdk.Deployment
		lctx *sdk.LaunchContext
	}{
		{"plan-declared", &sdk.Deployment{Name: "m", ServedName: "m", ModelDir: "/models/m", Env: map[string]string{"APP_MODE": "fast"},
			ExtraArgs: []string{"--verbose"}, AcceptExtraArgs: true, Resources: sdk.Resources{Declared: true, DeviceBytes: 8 << 30, HostBytes: 2 << 30}},
			&sdk.LaunchContext{Port: 4242, LaunchDir: "/state/launches/m-0", DeviceUUIDs: []string{"GPU-1"}}},
		{"plan-validate", &sdk.Deployment{Name: "m", ServedName: "m"}, &sdk.LaunchContext{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: drivertest.Value(c.dep), Host: drivertest.Value(host), Launch: drivertest.Value(c.lctx)})
			if err != nil {
				t.Fatal(err)
			}
			h := &resp.Hints
			got := drivertest.RenderPlan(resp, map[string]string{inst.Path: "<fake-engine>"}) +
				fmt.Sprintf("declared: ready_device=%d ready_host=%d startup_device=%d\n", h.ReadyDeviceBytes, h.ReadyHostBytes, h.StartupDeviceBytes)
			drivertest.Golden(t, c.name, got)
		})
	}
}

// TestPlan_Refusals: what a custom engine refuses, one code at a time.
func TestPlan_Refusals(t *testing.T) {
	d, inst := fakeProgram(t)
	cases := []struct {
		name string
		dep  *sdk.Deployment
		code string
	}{
		{"another api", &sdk.Deployment{API: "decisions"}, "capability_missing:decisions"},
		{"a park", &sdk.Deployment{Residency: "deep"}, "capability_missing:deep_park"},
		{"an unknown residency", &sdk.Deployment{Residency: "later"}, "invalid_config"},
		{"extra_args unaccepted", &sdk.Deployment{ExtraArgs: []string{"--x"}}, "extra_args_not_accepted"},
		{"a placeholder in extra_args", &sdk.Deployment{ExtraArgs: []string{"{{port}}"}, AcceptExtraArgs: true}, "invalid_config"},
		{"an owned variable", &sdk.Deployment{Env: map[string]string{"PATH": "/x"}}, "engine_env_reserved:PATH"},
		{"the key variable", &sdk.Deployment{Env: map[string]string{"FAKE_ENGINE_API_KEY": "x"}}, "engine_env_reserved:FAKE_ENGINE_API_KEY"},
		{"an unapproved variable", &sdk.Deployment{Env: map[string]string{"OTHER": "x"}}, "engine_env_not_approved:OTHER"},
		{"remote code", &sdk.Deployment{TrustRemoteCode: true}, "remote_code_not_allowed"},
		{"a group", &sdk.Deployment{Group: &sdk.Group{Rank: 1, Size: 2, TensorParallel: 2, PipelineParallel: 1, HeadAddress: "10.0.0.1", RendezvousPort: 25000, PeerAddress: "10.0.0.2"}}, "group_shape_unsupported:custom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := d.Plan(context.Background(), &sdk.PlanRequest{Installation: *inst, Deployment: drivertest.Value(c.dep)})
			if err != nil {
				t.Fatal(err)
			}
			if rs := resp.Refusals; len(rs) != 1 || rs[0].Code != c.code {
				t.Fatalf("refusals %v, want one %s", rs, c.code)
			}
		})
	}
}

// TestDriver_Lifecycle runs the fake engine as a custom program: start
// with the key in its variable, ready by a real answer, the manifest's idle
// signal, logs without the key, a fresh driver that re-attaches (from the
// recorded launch, and from the launch directory alone), a stop with proof,
// and a liveness answer that reads the exit.
func TestDriver_Lifecycle(t *testing.T) {
	ctx := context.Background()
	d, inst := fakeProgram(t)
	dep := &sdk.Deployment{Name: "m", ServedName: "m", ModelDir: t.TempDir()}
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: "m/0", LaunchID: "l1"}
	plan, err := d.Plan(ctx, &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Launch: *lctx})
	if err != nil || len(plan.Refusals) > 0 {
		t.Fatalf("plan %v %v", err, plan.Refusals)
	}
	st, err := d.Start(ctx, &sdk.StartRequest{Installation: *inst, Deployment: *dep, Launch: *lctx, Plan: *plan, EngineKey: "engine-key-123"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop(ctx, &sdk.StopRequest{InstanceID: "m/0", Launch: &st.Launch, Grace: 5 * time.Second})
	})
	ep := &st.Endpoint
	if ep.AuthValue != "Bearer engine-key-123" || ep.ChatPath != "/v1/chat/completions" || ep.ServedName != "m" ||
		ep.AbortMode != sdk.AbortModeCloseConnection || st.Launch.LaunchID != "l1" || len(st.Launch.Processes) != 2 ||
		ep.NonStreamedHangup != sdk.NonStreamedHangupStream {
		t.Fatalf("start %+v", st)
	}
	probe := func(d *Driver, kind sdk.ProbeKind) *sdk.ProbeResponse {
		t.Helper()
		p, err := d.Probe(ctx, &sdk.ProbeRequest{InstanceID: "m/0", Kind: kind, Deadline: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := probe(d, sdk.ProbeKindReadiness); !p.Ready || p.Canary == "" || p.Endpoint.BaseURL != ep.BaseURL {
		t.Fatalf("readiness %+v", p)
	}
	if p := probe(d, sdk.ProbeKindLiveness); !p.Alive {
		t.Fatalf("liveness %+v", p)
	}
	if l, err := d.Load(ctx, &sdk.LoadRequest{InstanceID: "m/0"}); err != nil || !l.Known || l.Running != 0 || l.KVUsage != -1 {
		t.Fatalf("load %+v %v", l, err)
	}
	if logs, err := d.Logs(ctx, &sdk.LogsRequest{InstanceID: "m/0"}); err != nil || logs.Text == "" || strings.Contains(logs.Text, "engine-key-123") {
		t.Fatalf("logs %v %q", err, logs.Text)
	}
	if rec, err := d.Recover(ctx, &sdk.RecoverRequest{InstanceID: "m/0", Launch: st.Launch}); err != nil || rec.State != sdk.RecoverStateRunning || rec.Detail != "handle kept by this driver" {
		t.Fatalf("recover a kept handle %+v %v", rec, err)
	}

	// A fresh driver needs the recorded manifest to re-attach.
	fresh := New()
	rec, err := fresh.Recover(ctx, &sdk.RecoverRequest{InstanceID: "m/0", Launch: st.Launch, Installation: sdk.Installation{Path: inst.Path}, Deployment: *dep})
	if err != nil || rec.State != sdk.RecoverStateUncertain || !strings.Contains(rec.Detail, "no recorded manifest") {
		t.Fatalf("recover without a manifest %+v %v", rec, err)
	}
	// Identities the core never recorded are read from the launch directory.
	fromDir := &sdk.Launch{LaunchDir: lctx.LaunchDir, Port: lctx.Port, LaunchID: "l1"}
	rec, err = fresh.Recover(ctx, &sdk.RecoverRequest{InstanceID: "m/0", Launch: *fromDir, Installation: *inst, Deployment: *dep, EngineKey: "engine-key-123"})
	if err != nil || rec.State != sdk.RecoverStateRunning || rec.Detail != "re-attached from the recorded launch" ||
		rec.Endpoint.AuthValue != "Bearer engine-key-123" || len(rec.Launch.Processes) != 2 {
		t.Fatalf("recover from the launch directory %+v %v", rec, err)
	}
	if p := probe(fresh, sdk.ProbeKindWakeCheck); !p.Ready {
		t.Fatalf("readiness after the re-attach %+v", p)
	}
	stop, err := fresh.Stop(ctx, &sdk.StopRequest{InstanceID: "m/0", Grace: 5 * time.Second})
	if err != nil || !stop.Gone || stop.Forced || stop.ExitCode != 0 {
		t.Fatalf("stop %+v %v", stop, err)
	}
	if _, err := fresh.Probe(ctx, &sdk.ProbeRequest{InstanceID: "m/0", Kind: sdk.ProbeKindLiveness}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("probe after the stop: %v", err)
	}
	// The first driver still holds its handle: liveness reads the exit.
	if p := probe(d, sdk.ProbeKindLiveness); p.Alive || !p.Exited || p.ExitCode != 0 || p.Code != sdk.CodeLaunchFailed {
		t.Fatalf("liveness after the stop %+v", p)
	}
	if rec, _ := New().Recover(ctx, &sdk.RecoverRequest{InstanceID: "m/0", Launch: st.Launch, Installation: *inst}); rec.State != sdk.RecoverStateGone {
		t.Fatalf("recover after the stop %+v", rec)
	}
}

// TestDriver_ExitAtStart: an engine that exits while it starts is reported
// at once, with its exit code and last lines.
func TestDriver_ExitAtStart(t *testing.T) {
	ctx := context.Background()
	d, inst := fakeProgram(t)
	dep := &sdk.Deployment{Name: "m", ServedName: "m"}
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: "m/0", LaunchID: "l1"}
	plan := &sdk.PlanResponse{Argv: []string{inst.Path, "no-such-command"}, Workdir: lctx.LaunchDir}
	st, err := d.Start(ctx, &sdk.StartRequest{Installation: *inst, Deployment: *dep, Launch: *lctx, Plan: *plan})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop(ctx, &sdk.StopRequest{InstanceID: "m/0", Launch: &st.Launch, Grace: 5 * time.Second})
	})
	p, err := d.Probe(ctx, &sdk.ProbeRequest{InstanceID: "m/0", Kind: sdk.ProbeKindReadiness, Deadline: 30 * time.Second})
	if err != nil || p.Ready || !p.Exited || p.ExitCode != 2 || p.Code != sdk.CodeLaunchFailed || len(p.LastLogLines) == 0 {
		t.Fatalf("probe %+v %v", p, err)
	}
}

// TestDriver_StartRefusals: a changed program and a start without a leased
// port are refused before anything runs; custom engines do not park.
func TestDriver_StartRefusals(t *testing.T) {
	ctx := context.Background()
	d, inst := fakeProgram(t)
	dep := &sdk.Deployment{Name: "m", ServedName: "m"}
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: "m/0"}
	plan, _ := d.Plan(ctx, &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Launch: *lctx})
	changed := &sdk.Installation{Path: inst.Path, Digest: "sha256:0000", Details: inst.Details}
	if _, err := d.Start(ctx, &sdk.StartRequest{Installation: *changed, Deployment: *dep, Launch: *lctx, Plan: *plan}); sdk.CodeOf(err) != "installation_drift" ||
		!strings.Contains(err.Error(), "engine add --custom") {
		t.Fatalf("a changed program: %v", err)
	}
	if _, err := d.Start(ctx, &sdk.StartRequest{Installation: *inst, Deployment: *dep, Launch: sdk.LaunchContext{}, Plan: *plan}); sdk.CodeOf(err) != sdk.CodeLaunchFailed {
		t.Fatalf("no leased port: %v", err)
	}
	if _, err := d.Park(ctx, &sdk.ParkRequest{}); err != sdk.ErrNotSupported {
		t.Fatalf("park: %v", err)
	}
	if a, _ := d.Abort(ctx, &sdk.AbortRequest{}); a.Mode != sdk.AbortModeCloseConnection {
		t.Fatalf("abort %+v", a)
	}
}

// TestParseManifest_NonStreamedHangup: the manifest says how the program
// learns of a non-streamed client's hang-up; anything but stream or stops
// is refused.
func TestParseManifest_NonStreamedHangup(t *testing.T) {
	cases := []struct {
		name, value string
		want        sdk.NonStreamedHangup
		code        string
	}{
		{"default", "", sdk.NonStreamedHangupStream, ""},
		{"stream", `non_streamed_hangup = "stream"`, sdk.NonStreamedHangupStream, ""},
		{"stops", `non_streamed_hangup = "stops"`, sdk.NonStreamedHangupStops, ""},
		{"unknown", `non_streamed_hangup = "sometimes"`, 0, "invalid_config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := "args = [\"--port\", \"{{port}}\"]\n" + c.value + "\n"
			m, err := ParseManifest([]byte(src), "m.hcl")
			if c.code != "" {
				if err == nil || !strings.Contains(err.Error(), "non_streamed_hangup") {
					t.Fatalf("err %v, want a refusal naming non_streamed_hangup", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h := newHandle("m/0", "l1", proc.Launched{}, 8000, "", m, &sdk.Deployment{ServedName: "m"}, time.Second)
			if got := h.Endpoint.NonStreamedHangup; got != c.want {
				t.Fatalf("endpoint says %v, want %v", got, c.want)
			}
		})
	}
}

// TestParseManifest_Bounds: a deeply nested or oversized manifest is
// refused with its position, without crashing the driver (this process).
func TestParseManifest_Bounds(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"nested list", "args = " + strings.Repeat("[", 100000) + "\n", "m.hcl:1:"},
		{"nested object", "env = " + strings.Repeat("{a = ", 100000) + "\n", "m.hcl:1:"},
		{"oversize", `args = ["serve"]` + "\n" + strings.Repeat("# padding padding padding\n", 50000), "m.hcl:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(c.src), "m.hcl")
			if err == nil || !strings.Contains(err.Error(), c.want) || sdk.CodeOf(err) != "invalid_config" {
				t.Fatalf("err = %v, want invalid_config at %q", err, c.want)
			}
		})
	}
}
