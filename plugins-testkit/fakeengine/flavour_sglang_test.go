// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// sglangEngine runs an SGLang-flavoured engine with key "k".
func sglangEngine(t *testing.T, o fakeengine.SGLangOptions, cfg fakeengine.Config) (*testEngine, *fakeengine.SGLang) {
	t.Helper()
	f := fakeengine.NewSGLang(o)
	cfg.Flavour = f
	if cfg.APIKey == "" {
		cfg.APIKey = "k"
	}
	return startEngine(t, cfg, true), f
}

var jsonKey = map[string]string{"Authorization": "Bearer k", "Content-Type": "application/json"}

func TestSGLang_Routes(t *testing.T) {
	te, _ := sglangEngine(t, fakeengine.SGLangOptions{Metrics: true, ContextLength: 4096, ModelPath: "/models/m", Version: "0.5.21"}, fakeengine.Config{})
	// The first health check after the server opens finds it Starting.
	if status, _, _ := do(t, "GET", te.url+"/health", "", nil); status != 503 {
		t.Fatalf("first health: %d, want 503 (Starting)", status)
	}
	cases := []struct {
		name       string
		method     string
		path       string
		body       string
		header     map[string]string
		wantStatus int
		wantIn     []string
	}{
		{name: "health is open", method: "GET", path: "/health", wantStatus: 200},
		{name: "health_generate", method: "GET", path: "/health_generate", wantStatus: 200},
		{name: "metrics are open", method: "GET", path: "/metrics", wantStatus: 200,
			wantIn: []string{`sglang:num_running_reqs{model_name="m",`, "sglang:num_queue_reqs{", "sglang:token_usage{", "sglang:generation_tokens_total{"}},
		{name: "models need the key", method: "GET", path: "/v1/models", wantStatus: 401, wantIn: []string{`{"error":"Unauthorized"}`}},
		{name: "models", method: "GET", path: "/v1/models", header: jsonKey, wantStatus: 200,
			wantIn: []string{`"id":"m"`, `"owned_by":"sglang"`, `"max_model_len":4096`}},
		{name: "one model", method: "GET", path: "/v1/models/m", header: jsonKey, wantStatus: 200, wantIn: []string{`"owned_by":"sglang"`}},
		{name: "unknown model", method: "GET", path: "/v1/models/x", header: jsonKey, wantStatus: 404, wantIn: []string{`"object":"error"`, `"code":404`}},
		{name: "server info", method: "GET", path: "/get_server_info", header: jsonKey, wantStatus: 200, wantIn: []string{`"version":"0.5.21"`, `"tokenizer_worker_num":1`}},
		{name: "model info", method: "GET", path: "/get_model_info", header: jsonKey, wantStatus: 200, wantIn: []string{`"model_path":"/models/m"`}},
		{name: "chat needs json", method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", nil), header: keyHeader, wantStatus: 400,
			wantIn: []string{"Unsupported Media Type"}},
		{name: "chat with a rid", method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", map[string]any{"rid": "r-1"}), header: jsonKey, wantStatus: 200,
			wantIn: []string{`"id":"chatcmpl-r-1"`}},
		{name: "bad rid", method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", map[string]any{"rid": 3}), header: jsonKey, wantStatus: 400,
			wantIn: []string{`"object":"error"`}},
		{name: "flush when idle", method: "POST", path: "/flush_cache", header: jsonKey, wantStatus: 200, wantIn: []string{"Cache flushed."}},
		{name: "unknown path", method: "GET", path: "/nope", header: jsonKey, wantStatus: 404, wantIn: []string{`{"detail":"Not Found"}`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body, _ := do(t, c.method, te.url+c.path, c.body, c.header)
			if status != c.wantStatus {
				t.Fatalf("%s %s = %d %s, want %d", c.method, c.path, status, body, c.wantStatus)
			}
			for _, s := range c.wantIn {
				if !strings.Contains(string(body), s) {
					t.Fatalf("body lacks %q:\n%s", s, body)
				}
			}
		})
	}
}

func TestSGLang_MetricsNeedTheFlag(t *testing.T) {
	te, _ := sglangEngine(t, fakeengine.SGLangOptions{}, fakeengine.Config{})
	if status, _, _ := do(t, "GET", te.url+"/metrics", "", nil); status != 404 {
		t.Fatalf("metrics without --enable-metrics: %d", status)
	}
}

func TestSGLang_AbortByRid(t *testing.T) {
	te, _ := sglangEngine(t, fakeengine.SGLangOptions{MemorySaver: true}, fakeengine.Config{StallAfterTokens: 1})
	s, ready := startStream(t, te.url, chatBody("m", "hi", map[string]any{"stream": true, "rid": "r-7"}), jsonKey)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	s.next(t) // role
	s.next(t) // first token; then it stalls
	// Busy: flush is refused, and so is a release.
	if status, _, _ := do(t, "POST", te.url+"/flush_cache", "", jsonKey); status != 400 {
		t.Fatalf("flush while busy: %d", status)
	}
	if status, _, _ := do(t, "POST", te.url+"/release_memory_occupation", `{}`, jsonKey); status != 400 {
		t.Fatalf("release while busy: %d", status)
	}
	if status, _, _ := do(t, "POST", te.url+"/abort_request", `{"rid":"other"}`, jsonKey); status != 200 {
		t.Fatalf("abort of another rid: %d", status)
	}
	if status, _, _ := do(t, "POST", te.url+"/abort_request", `{"rid":"r-7","abort_all":false}`, jsonKey); status != 200 {
		t.Fatalf("abort: %d", status)
	}
	if ev := s.next(t); !strings.Contains(ev, `"finish_reason":"abort"`) || !strings.Contains(ev, `"id":"chatcmpl-r-7"`) {
		t.Fatalf("aborted stream: %s", ev)
	}
	waitFor(t, "the slot freed", func() bool { return te.Stats().Running == 0 })
	if st := te.Stats(); st.Cancelled != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSGLang_ReleaseResume(t *testing.T) {
	cases := []struct {
		name       string
		backup     bool
		wantStale  bool
		wantReload bool
	}{
		{name: "deep: weights reloaded from disk", wantStale: true, wantReload: true},
		{name: "host backed: weights kept in host RAM", backup: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, dev := newSimGPU(t, 1000)
			te, f := sglangEngine(t, fakeengine.SGLangOptions{MemorySaver: true, WeightsCPUBackup: c.backup}, fakeengine.Config{
				Sim: fakeengine.SimConfig{StatePath: g.Path(), Visible: dev.UUID, Weights: 400, KV: 200, ParkResidue: 30},
			})
			_, before := sglangChat(t, te, "Reply exactly OK")
			if status, body, _ := do(t, "POST", te.url+"/release_memory_occupation", `{"tags":["kv_cache","weights"]}`, jsonKey); status != 200 || strings.TrimSpace(string(body)) != "null" {
				t.Fatalf("release: %d %s", status, body)
			}
			if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"park_residue": 30}) {
				t.Fatalf("released: %v", got)
			}
			if status, _, _ := do(t, "GET", te.url+"/health", "", nil); status != 503 {
				t.Fatalf("health while released: %d", status)
			}
			// A request while released waits for the resume.
			answered := make(chan string, 1)
			go func() { _, text := sglangChat(t, te, "Reply exactly OK"); answered <- text }()
			waitFor(t, "a waiting request", func() bool { return te.Stats().Waiting == 1 })
			if status, body, _ := do(t, "POST", te.url+"/update_weights_from_disk", `{"model_path":"/m"}`, jsonKey); status != 400 || !strings.Contains(string(body), `"success":false`) {
				t.Fatalf("reload while released: %d %s", status, body)
			}
			if status, _, _ := do(t, "POST", te.url+"/resume_memory_occupation", `{"tags":["weights","kv_cache"]}`, jsonKey); status != 200 {
				t.Fatalf("resume: %d", status)
			}
			if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "kv_cache": 200}) {
				t.Fatalf("resumed: %v", got)
			}
			text := <-answered
			if (text != before) != c.wantStale || f.Stale() != c.wantStale {
				t.Fatalf("answer after resume %q (before %q), stale %v, want stale %v", text, before, f.Stale(), c.wantStale)
			}
			if status, body, _ := do(t, "POST", te.url+"/update_weights_from_disk", `{"model_path":"/m"}`, jsonKey); status != 200 || !strings.Contains(string(body), `"success":true`) {
				t.Fatalf("reload: %d %s", status, body)
			}
			if _, text := sglangChat(t, te, "Reply exactly OK"); text != before {
				t.Fatalf("after the reload %q, want %q", text, before)
			}
			if status, _, _ := do(t, "POST", te.url+"/flush_cache", "", jsonKey); status != 200 || f.Flushes() != 1 {
				t.Fatalf("flush: %d", status)
			}
		})
	}
}

func TestSGLang_ReleaseWithoutMemorySaver(t *testing.T) {
	g, dev := newSimGPU(t, 1000)
	te, _ := sglangEngine(t, fakeengine.SGLangOptions{}, fakeengine.Config{
		Sim: fakeengine.SimConfig{StatePath: g.Path(), Visible: dev.UUID, Weights: 400, KV: 200, ParkResidue: 30},
	})
	if status, _, _ := do(t, "POST", te.url+"/release_memory_occupation", `{}`, jsonKey); status != 200 {
		t.Fatalf("release: %d", status)
	}
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "kv_cache": 200}) {
		t.Fatalf("without --enable-memory-saver nothing is freed: %v", got)
	}
	if !strings.Contains(te.stderr.String(), "no-op") {
		t.Fatalf("no warning logged: %s", te.stderr)
	}
}

func TestSGLang_Decisions(t *testing.T) {
	te, _ := sglangEngine(t, fakeengine.SGLangOptions{}, fakeengine.Config{})
	req := decisions.ReadinessRequest("m")
	req.Rid = "d-1"
	body, _ := json.Marshal(req)
	status, data, _ := do(t, "POST", te.url+decisions.Path, string(body), jsonKey)
	if status != 200 {
		t.Fatalf("decision: %d %s", status, data)
	}
	var resp decisions.Response
	if err := json.Unmarshal(data, &resp); err != nil {
		t.Fatal(err)
	}
	if err := decisions.Check(req, &resp); err != nil {
		t.Fatalf("decision answer: %v\n%s", err, data)
	}
	if status, _, _ := do(t, "POST", te.url+decisions.Path, `{"model":"m","state":"x","questions":[]}`, jsonKey); status != 400 {
		t.Fatalf("invalid decision: %d", status)
	}
}

// sglangChat sends a non-streamed chat with the key and returns the status
// and the answer's content.
func sglangChat(t *testing.T, te *testEngine, prompt string) (int, string) {
	t.Helper()
	status, body, _ := do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", prompt, map[string]any{"temperature": 0}), jsonKey)
	var c fakeengine.ChatCompletion
	if status == 200 {
		if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) == 0 {
			t.Fatalf("chat answer %s: %v", body, err)
		}
		return status, c.Choices[0].Message.Content
	}
	return status, string(body)
}
