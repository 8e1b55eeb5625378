// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build integration

package llamacpp

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
)

// TestIntegration_RealLlamaServer runs the driver against a real
// llama-server (CAPYCTL_LLAMA_SERVER=/path/to/llama-server) with
// stories260K.gguf: detect, plan, start, readiness (health, models, props,
// a real answer), an answer with usage and timings, the same answer
// streamed (its pieces, then usage and timings, then [DONE]), the idle
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
	det, err := d.Detect(ctx, &sdk.DetectRequest{Path: bin})
	if err != nil {
		t.Fatalf("detect %s: %v", bin, err)
	}
	t.Logf("llama-server %s (%s), notes %v", det.Version, det.Details["commit"], det.Notes)
	// The installation as engine add registers it: with the details Detect
	// read (the options of this build's --help), so the plan renders only
	// options this build takes (an older build refuses --no-kv-unified,
	// --fit, --cache-ram, --offline).
	inst := &sdk.Installation{Name: "llamacpp", Family: Family, Path: det.Program, Version: det.Version, Digest: det.Digest, Details: det.Details}
	dep := deployment(modelDir(t))
	dep.MaxConcurrentRequests, dep.ContextLength = 2, 256
	lctx := &sdk.LaunchContext{Port: int32(drivertest.FreePort(t)), LaunchDir: t.TempDir(), InstanceID: "stories/0", LaunchID: "it"}
	plan, err := d.Plan(ctx, &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Launch: *lctx})
	if err != nil || len(plan.Refusals) > 0 {
		t.Fatalf("plan: %v %v", err, plan.Refusals)
	}
	t.Logf("argv: %s", strings.Join(plan.Argv, " "))
	if opts := det.Details[detailOptions]; opts != "" {
		for _, a := range plan.Argv[1:] {
			if strings.HasPrefix(a, "--") && !supports(inst, a) {
				t.Fatalf("the plan renders %s, which this build's --help does not list", a)
			}
		}
	}
	resp, err := d.Start(ctx, &sdk.StartRequest{Installation: *inst, Deployment: *dep, Launch: *lctx, Plan: *plan, EngineKey: "integration-key"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx, &sdk.StopRequest{InstanceID: "stories/0", Grace: 10 * time.Second})
	ready, err := d.Probe(ctx, &sdk.ProbeRequest{InstanceID: "stories/0", Kind: sdk.ProbeKindReadiness, Deadline: 120 * time.Second})
	if err != nil || !ready.Ready {
		t.Fatalf("readiness %+v %v\n(a build older than the flags the driver renders refuses them: see the log lines)", ready, err)
	}
	t.Logf("canary: %q", ready.Canary)
	// The endpoint is a loopback port, or a Unix socket on a build that
	// binds one (engineapi's client dials either).
	ep := &resp.Endpoint
	t.Logf("endpoint %s (%s)", ep.BaseURL, ep.Listener)
	client := engineapi.NewEngineClient(ep.BaseURL, ep.AuthHeader, ep.AuthValue)
	defer client.CloseIdleConnections()
	const question = `"max_tokens":16,"temperature":0,"messages":[{"role":"user","content":"Once upon a time"}]`
	// Non-streamed: the answer with usage and llama-server's timings.
	req, err := client.NewRequest(ctx, http.MethodPost, ep.ChatPath, strings.NewReader(`{"model":"stories","stream":false,`+question+`}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage   map[string]int     `json:"usage"`
		Timings map[string]float64 `json:"timings"`
	}
	json.NewDecoder(r.Body).Decode(&answer)
	r.Body.Close()
	if r.StatusCode != 200 || len(answer.Choices) == 0 || answer.Choices[0].Message.Content == "" ||
		answer.Usage["completion_tokens"] == 0 || answer.Timings["predicted_n"] == 0 {
		t.Fatalf("answer %d %+v", r.StatusCode, answer)
	}
	whole := answer.Choices[0].Message.Content

	// Streamed: server-sent events, each a piece of the same answer (the
	// temperature is 0), then a last chunk with usage and timings, then
	// [DONE]. The router relays exactly this.
	req, err = client.NewRequest(ctx, http.MethodPost, ep.ChatPath,
		strings.NewReader(`{"model":"stories","stream":true,"stream_options":{"include_usage":true},`+question+`}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	streamed, pieces, last, done := readChatStream(t, r)
	if r.StatusCode != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
	}
	if !done {
		t.Fatal("the stream did not end with data: [DONE]")
	}
	if pieces < 2 || streamed != whole {
		t.Fatalf("the stream carried %q in %d pieces, want the non-streamed answer %q in several", streamed, pieces, whole)
	}
	if last.Usage["completion_tokens"] != answer.Usage["completion_tokens"] || last.Timings["predicted_n"] == 0 {
		t.Fatalf("the stream's last chunk: usage %v timings %v, want the answer's usage %v and timings", last.Usage, last.Timings, answer.Usage)
	}
	t.Logf("streamed %q in %d pieces; usage %v; the engine closed the connection after it: %v", streamed, pieces, last.Usage, r.Close)

	load, err := d.Load(ctx, &sdk.LoadRequest{InstanceID: "stories/0"})
	if err != nil || !load.Known || load.Running != 0 {
		t.Fatalf("load %+v %v", load, err)
	}
	stop, err := d.Stop(ctx, &sdk.StopRequest{InstanceID: "stories/0", Grace: 10 * time.Second})
	if err != nil || !stop.Gone {
		t.Fatalf("stop %+v %v", stop, err)
	}
	t.Logf("stopped: exit %d forced %v", stop.ExitCode, stop.Forced)
}

// streamChunk is the part of a streamed chat chunk the test reads.
type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage   map[string]int     `json:"usage"`
	Timings map[string]float64 `json:"timings"`
}

// readChatStream reads a streamed chat answer to its end: the content it
// carried, in how many non-empty pieces, the last chunk with usage, and
// whether it ended with [DONE].
func readChatStream(t *testing.T, r *http.Response) (text string, pieces int, last streamChunk, done bool) {
	t.Helper()
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	var b strings.Builder
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c streamChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("a chunk that is not JSON: %q: %v", data, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				b.WriteString(ch.Delta.Content)
				pieces++
			}
		}
		if c.Usage != nil {
			last = c
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read the stream: %v", err)
	}
	return b.String(), pieces, last, done
}
