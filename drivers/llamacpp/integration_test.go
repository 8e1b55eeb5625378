// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build integration

package llamacpp

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/sdk/engineapi"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// TestIntegration_RealLlamaServer runs the driver against a real
// llama-server (CAPYCTL_LLAMA_SERVER=/path/to/llama-server) with
// stories260K.gguf: detect, plan, start, readiness (health, models, props,
// a real answer), a streamed answer with usage and timings, the idle
// signal, and a stop that leaves nothing. The plan renders only the
// options the build's --help lists (Detect's details), so an older build
// or one from a source tarball ("version: 0 (unknown)") runs too. It skips
// without the variable.
//
//	CAPYCTL_LLAMA_SERVER=/opt/llama.cpp/build/bin/llama-server make test-integration
func TestIntegration_RealLlamaServer(t *testing.T) {
	bin := os.Getenv("CAPYCTL_LLAMA_SERVER")
	if bin == "" {
		t.Skip("CAPYCTL_LLAMA_SERVER is not set: no real llama-server to run against")
	}
	d := New()
	d.systemConfig = ""
	ctx := context.Background()
	det, err := d.Detect(ctx, &pb.DetectRequest{Path: bin})
	if err != nil {
		t.Fatalf("detect %s: %v", bin, err)
	}
	t.Logf("llama-server %s (%s), notes %v", det.GetVersion(), det.GetDetails()["commit"], det.GetNotes())
	// The installation as engine add registers it: with the details Detect
	// read (the options of this build's --help), so the plan renders only
	// options this build takes (an older build refuses --no-kv-unified,
	// --fit, --cache-ram, --offline).
	inst := &pb.Installation{Name: "llamacpp", Family: Family, Path: det.GetProgram(), Version: det.GetVersion(), Digest: det.GetDigest(), Details: det.GetDetails()}
	dep := deployment(modelDir(t))
	dep.MaxConcurrentRequests, dep.ContextLength = 2, 256
	lctx := &pb.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceId: "stories/0", LaunchId: "it"}
	plan, err := d.Plan(ctx, &pb.PlanRequest{Installation: inst, Deployment: dep, Launch: lctx})
	if err != nil || len(plan.GetRefusals()) > 0 {
		t.Fatalf("plan: %v %v", err, plan.GetRefusals())
	}
	t.Logf("argv: %s", strings.Join(plan.GetArgv(), " "))
	if opts := det.GetDetails()[detailOptions]; opts != "" {
		for _, a := range plan.GetArgv()[1:] {
			if strings.HasPrefix(a, "--") && !supports(inst, a) {
				t.Fatalf("the plan renders %s, which this build's --help does not list", a)
			}
		}
	}
	resp, err := d.Start(ctx, &pb.StartRequest{Installation: inst, Deployment: dep, Launch: lctx, Plan: plan, EngineKey: "integration-key"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx, &pb.StopRequest{InstanceId: "stories/0", GraceMs: 10_000})
	ready, err := d.Probe(ctx, &pb.ProbeRequest{InstanceId: "stories/0", Kind: pb.ProbeKind_PROBE_KIND_READINESS, DeadlineMs: 120_000})
	if err != nil || !ready.GetReady() {
		t.Fatalf("readiness %+v %v\n(a build older than the flags the driver renders refuses them: see the log lines)", ready, err)
	}
	t.Logf("canary: %q", ready.GetCanary())
	// The endpoint is a loopback port, or a Unix socket on a build that
	// binds one (engineapi's client dials either).
	ep := resp.GetEndpoint()
	t.Logf("endpoint %s (%s)", ep.GetBaseUrl(), ep.GetListener())
	client := engineapi.NewEngineClient(ep.GetBaseUrl(), ep.GetAuthHeader(), ep.GetAuthValue())
	defer client.CloseIdleConnections()
	req, err := client.NewRequest(ctx, http.MethodPost, ep.GetChatPath(),
		strings.NewReader(`{"model":"stories","stream":false,"max_tokens":16,"temperature":0,"messages":[{"role":"user","content":"Once upon a time"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Usage   map[string]int     `json:"usage"`
		Timings map[string]float64 `json:"timings"`
	}
	json.NewDecoder(r.Body).Decode(&answer)
	r.Body.Close()
	if r.StatusCode != 200 || answer.Usage["completion_tokens"] == 0 || answer.Timings["predicted_n"] == 0 {
		t.Fatalf("answer %d %+v", r.StatusCode, answer)
	}
	load, err := d.Load(ctx, &pb.LoadRequest{InstanceId: "stories/0"})
	if err != nil || !load.GetKnown() || load.GetRunning() != 0 {
		t.Fatalf("load %+v %v", load, err)
	}
	stop, err := d.Stop(ctx, &pb.StopRequest{InstanceId: "stories/0", GraceMs: 10_000})
	if err != nil || !stop.GetGone() {
		t.Fatalf("stop %+v %v", stop, err)
	}
	t.Logf("stopped: exit %d forced %v", stop.GetExitCode(), stop.GetForced())
}
