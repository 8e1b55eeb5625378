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
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
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
func fakeProgram(t *testing.T) (*Driver, *pb.Installation) {
	t.Helper()
	_, fake := harness.Binaries(t)
	d := New()
	det, err := d.Detect(context.Background(), &pb.DetectRequest{Path: fake, Manifest: testManifest()})
	if err != nil {
		t.Fatal(err)
	}
	return d, &pb.Installation{Name: "fake", Family: Family, Path: fake, Version: det.GetVersion(), Digest: det.GetDigest(), Details: det.GetDetails()}
}

// TestPlan_Golden renders the manifest's command and environment: the
// placeholders filled, the key kept out of the plan, the host's and the
// deployment's variables, the declared memory.
func TestPlan_Golden(t *testing.T) {
	d, inst := fakeProgram(t)
	host := &pb.HostPolicy{HostEnv: map[string]string{"HOST_VAR": "1"}, ApprovedEnv: []string{"APP_*"}}
	cases := []struct {
		name string
		dep  *pb.Deployment
		lctx *pb.LaunchContext
	}{
		{"plan-declared", &pb.Deployment{Name: "m", ServedName: "m", ModelDir: "/models/m", Env: map[string]string{"APP_MODE": "fast"},
			ExtraArgs: []string{"--verbose"}, AcceptExtraArgs: true, Resources: &pb.Resources{Declared: true, DeviceBytes: 8 << 30, HostBytes: 2 << 30}},
			&pb.LaunchContext{Port: 4242, LaunchDir: "/state/launches/m-0", DeviceUuids: []string{"GPU-1"}}},
		{"plan-validate", &pb.Deployment{Name: "m", ServedName: "m"}, &pb.LaunchContext{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := d.Plan(context.Background(), &pb.PlanRequest{Installation: inst, Deployment: c.dep, Host: host, Launch: c.lctx})
			if err != nil {
				t.Fatal(err)
			}
			h := resp.GetHints()
			got := drivertest.RenderPlan(resp, map[string]string{inst.GetPath(): "<fake-engine>"}) +
				fmt.Sprintf("declared: ready_device=%d ready_host=%d startup_device=%d\n", h.GetReadyDeviceBytes(), h.GetReadyHostBytes(), h.GetStartupDeviceBytes())
			drivertest.Golden(t, c.name, got)
		})
	}
}

// TestPlan_Refusals: what a custom engine refuses, one code at a time.
func TestPlan_Refusals(t *testing.T) {
	d, inst := fakeProgram(t)
	cases := []struct {
		name string
		dep  *pb.Deployment
		code string
	}{
		{"another api", &pb.Deployment{Api: "decisions"}, "capability_missing:decisions"},
		{"a park", &pb.Deployment{Residency: "deep"}, "capability_missing:deep_park"},
		{"an unknown residency", &pb.Deployment{Residency: "later"}, "invalid_config"},
		{"extra_args unaccepted", &pb.Deployment{ExtraArgs: []string{"--x"}}, "extra_args_not_accepted"},
		{"a placeholder in extra_args", &pb.Deployment{ExtraArgs: []string{"{{port}}"}, AcceptExtraArgs: true}, "invalid_config"},
		{"an owned variable", &pb.Deployment{Env: map[string]string{"PATH": "/x"}}, "engine_env_reserved:PATH"},
		{"the key variable", &pb.Deployment{Env: map[string]string{"FAKE_ENGINE_API_KEY": "x"}}, "engine_env_reserved:FAKE_ENGINE_API_KEY"},
		{"an unapproved variable", &pb.Deployment{Env: map[string]string{"OTHER": "x"}}, "engine_env_not_approved:OTHER"},
		{"remote code", &pb.Deployment{TrustRemoteCode: true}, "remote_code_not_allowed"},
		{"a group", &pb.Deployment{Group: &pb.Group{Rank: 1, Size: 2, TensorParallel: 2, PipelineParallel: 1, HeadAddress: "10.0.0.1", RendezvousPort: 25000, PeerAddress: "10.0.0.2"}}, "group_shape_unsupported:custom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := d.Plan(context.Background(), &pb.PlanRequest{Installation: inst, Deployment: c.dep})
			if err != nil {
				t.Fatal(err)
			}
			if rs := resp.GetRefusals(); len(rs) != 1 || rs[0].GetCode() != c.code {
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
	dep := &pb.Deployment{Name: "m", ServedName: "m", ModelDir: t.TempDir()}
	lctx := &pb.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceId: "m/0", LaunchId: "l1"}
	plan, err := d.Plan(ctx, &pb.PlanRequest{Installation: inst, Deployment: dep, Launch: lctx})
	if err != nil || len(plan.GetRefusals()) > 0 {
		t.Fatalf("plan %v %v", err, plan.GetRefusals())
	}
	st, err := d.Start(ctx, &pb.StartRequest{Installation: inst, Deployment: dep, Launch: lctx, Plan: plan, EngineKey: "engine-key-123"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop(ctx, &pb.StopRequest{InstanceId: "m/0", Launch: st.GetLaunch(), GraceMs: 5000}) })
	ep := st.GetEndpoint()
	if ep.GetAuthValue() != "Bearer engine-key-123" || ep.GetChatPath() != "/v1/chat/completions" || ep.GetServedName() != "m" ||
		ep.GetAbortMode() != pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION || st.GetLaunch().GetLaunchId() != "l1" || len(st.GetLaunch().GetProcesses()) != 2 ||
		ep.GetNonStreamedHangup() != pb.NonStreamedHangup_NON_STREAMED_HANGUP_STREAM {
		t.Fatalf("start %+v", st)
	}
	probe := func(d *Driver, kind pb.ProbeKind) *pb.ProbeResponse {
		t.Helper()
		p, err := d.Probe(ctx, &pb.ProbeRequest{InstanceId: "m/0", Kind: kind, DeadlineMs: 30_000})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := probe(d, pb.ProbeKind_PROBE_KIND_READINESS); !p.GetReady() || p.GetCanary() == "" || p.GetEndpoint().GetBaseUrl() != ep.GetBaseUrl() {
		t.Fatalf("readiness %+v", p)
	}
	if p := probe(d, pb.ProbeKind_PROBE_KIND_LIVENESS); !p.GetAlive() {
		t.Fatalf("liveness %+v", p)
	}
	if l, err := d.Load(ctx, &pb.LoadRequest{InstanceId: "m/0"}); err != nil || !l.GetKnown() || l.GetRunning() != 0 || l.GetKvUsage() != -1 {
		t.Fatalf("load %+v %v", l, err)
	}
	if logs, err := d.Logs(ctx, &pb.LogsRequest{InstanceId: "m/0"}); err != nil || logs.GetText() == "" || strings.Contains(logs.GetText(), "engine-key-123") {
		t.Fatalf("logs %v %q", err, logs.GetText())
	}
	if rec, err := d.Recover(ctx, &pb.RecoverRequest{InstanceId: "m/0", Launch: st.GetLaunch()}); err != nil || rec.GetState() != pb.RecoverState_RECOVER_STATE_RUNNING || rec.GetDetail() != "handle kept by this driver" {
		t.Fatalf("recover a kept handle %+v %v", rec, err)
	}

	// A fresh driver needs the recorded manifest to re-attach.
	fresh := New()
	rec, err := fresh.Recover(ctx, &pb.RecoverRequest{InstanceId: "m/0", Launch: st.GetLaunch(), Installation: &pb.Installation{Path: inst.GetPath()}, Deployment: dep})
	if err != nil || rec.GetState() != pb.RecoverState_RECOVER_STATE_UNCERTAIN || !strings.Contains(rec.GetDetail(), "no recorded manifest") {
		t.Fatalf("recover without a manifest %+v %v", rec, err)
	}
	// Identities the core never recorded are read from the launch directory.
	fromDir := &pb.Launch{LaunchDir: lctx.GetLaunchDir(), Port: lctx.GetPort(), LaunchId: "l1"}
	rec, err = fresh.Recover(ctx, &pb.RecoverRequest{InstanceId: "m/0", Launch: fromDir, Installation: inst, Deployment: dep, EngineKey: "engine-key-123"})
	if err != nil || rec.GetState() != pb.RecoverState_RECOVER_STATE_RUNNING || rec.GetDetail() != "re-attached from the recorded launch" ||
		rec.GetEndpoint().GetAuthValue() != "Bearer engine-key-123" || len(rec.GetLaunch().GetProcesses()) != 2 {
		t.Fatalf("recover from the launch directory %+v %v", rec, err)
	}
	if p := probe(fresh, pb.ProbeKind_PROBE_KIND_WAKE_CHECK); !p.GetReady() {
		t.Fatalf("readiness after the re-attach %+v", p)
	}
	stop, err := fresh.Stop(ctx, &pb.StopRequest{InstanceId: "m/0", GraceMs: 5000})
	if err != nil || !stop.GetGone() || stop.GetForced() || stop.GetExitCode() != 0 {
		t.Fatalf("stop %+v %v", stop, err)
	}
	if _, err := fresh.Probe(ctx, &pb.ProbeRequest{InstanceId: "m/0", Kind: pb.ProbeKind_PROBE_KIND_LIVENESS}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("probe after the stop: %v", err)
	}
	// The first driver still holds its handle: liveness reads the exit.
	if p := probe(d, pb.ProbeKind_PROBE_KIND_LIVENESS); p.GetAlive() || !p.GetExited() || p.GetExitCode() != 0 || p.GetCode() != sdk.CodeLaunchFailed {
		t.Fatalf("liveness after the stop %+v", p)
	}
	if rec, _ := New().Recover(ctx, &pb.RecoverRequest{InstanceId: "m/0", Launch: st.GetLaunch(), Installation: inst}); rec.GetState() != pb.RecoverState_RECOVER_STATE_GONE {
		t.Fatalf("recover after the stop %+v", rec)
	}
}

// TestDriver_ExitAtStart: an engine that exits while it starts is reported
// at once, with its exit code and last lines.
func TestDriver_ExitAtStart(t *testing.T) {
	ctx := context.Background()
	d, inst := fakeProgram(t)
	dep := &pb.Deployment{Name: "m", ServedName: "m"}
	lctx := &pb.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceId: "m/0", LaunchId: "l1"}
	plan := &pb.PlanResponse{Argv: []string{inst.GetPath(), "no-such-command"}, Workdir: lctx.GetLaunchDir()}
	st, err := d.Start(ctx, &pb.StartRequest{Installation: inst, Deployment: dep, Launch: lctx, Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop(ctx, &pb.StopRequest{InstanceId: "m/0", Launch: st.GetLaunch(), GraceMs: 5000}) })
	p, err := d.Probe(ctx, &pb.ProbeRequest{InstanceId: "m/0", Kind: pb.ProbeKind_PROBE_KIND_READINESS, DeadlineMs: 30_000})
	if err != nil || p.GetReady() || !p.GetExited() || p.GetExitCode() != 2 || p.GetCode() != sdk.CodeLaunchFailed || len(p.GetLastLogLines()) == 0 {
		t.Fatalf("probe %+v %v", p, err)
	}
}

// TestDriver_StartRefusals: a changed program and a start without a leased
// port are refused before anything runs; custom engines do not park.
func TestDriver_StartRefusals(t *testing.T) {
	ctx := context.Background()
	d, inst := fakeProgram(t)
	dep := &pb.Deployment{Name: "m", ServedName: "m"}
	lctx := &pb.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceId: "m/0"}
	plan, _ := d.Plan(ctx, &pb.PlanRequest{Installation: inst, Deployment: dep, Launch: lctx})
	changed := &pb.Installation{Path: inst.GetPath(), Digest: "sha256:0000", Details: inst.GetDetails()}
	if _, err := d.Start(ctx, &pb.StartRequest{Installation: changed, Deployment: dep, Launch: lctx, Plan: plan}); sdk.CodeOf(err) != "installation_drift" ||
		!strings.Contains(err.Error(), "engine add --custom") {
		t.Fatalf("a changed program: %v", err)
	}
	if _, err := d.Start(ctx, &pb.StartRequest{Installation: inst, Deployment: dep, Launch: &pb.LaunchContext{}, Plan: plan}); sdk.CodeOf(err) != sdk.CodeLaunchFailed {
		t.Fatalf("no leased port: %v", err)
	}
	if _, err := d.Park(ctx, &pb.ParkRequest{}); err != sdk.ErrNotSupported {
		t.Fatalf("park: %v", err)
	}
	if a, _ := d.Abort(ctx, &pb.AbortRequest{}); a.GetMode() != pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION {
		t.Fatalf("abort %+v", a)
	}
}

// TestParseManifest_NonStreamedHangup: the manifest says how the program
// learns of a non-streamed client's hang-up; anything but stream or stops
// is refused.
func TestParseManifest_NonStreamedHangup(t *testing.T) {
	cases := []struct {
		name, value string
		want        pb.NonStreamedHangup
		code        string
	}{
		{"default", "", pb.NonStreamedHangup_NON_STREAMED_HANGUP_STREAM, ""},
		{"stream", `non_streamed_hangup = "stream"`, pb.NonStreamedHangup_NON_STREAMED_HANGUP_STREAM, ""},
		{"stops", `non_streamed_hangup = "stops"`, pb.NonStreamedHangup_NON_STREAMED_HANGUP_STOPS, ""},
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
			h := newHandle("m/0", "l1", proc.Launched{}, 8000, "", m, &pb.Deployment{ServedName: "m"}, time.Second)
			if got := h.Endpoint.GetNonStreamedHangup(); got != c.want {
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
