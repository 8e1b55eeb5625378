// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// vllmEngine runs a vLLM-flavoured engine with key "k".
func vllmEngine(t *testing.T, o fakeengine.VLLMOptions, cfg fakeengine.Config) (*testEngine, *fakeengine.VLLM) {
	t.Helper()
	f := fakeengine.NewVLLM(o)
	cfg.Flavour = f
	if cfg.APIKey == "" {
		cfg.APIKey = "k"
	}
	return startEngine(t, cfg, true), f
}

var keyHeader = map[string]string{"Authorization": "Bearer k"}

func TestVLLM_Routes(t *testing.T) {
	te, _ := vllmEngine(t, fakeengine.VLLMOptions{Version: "0.31.0", MaxModelLen: 8192, Root: "/models/m"}, fakeengine.Config{})
	cases := []struct {
		name       string
		method     string
		path       string
		body       string
		header     map[string]string
		wantStatus int
		wantBody   string // exact (trimmed) when set
		wantIn     []string
	}{
		{name: "health is empty and open", method: "GET", path: "/health", wantStatus: 200, wantBody: ""},
		{name: "version", method: "GET", path: "/version", wantStatus: 200, wantBody: `{"version":"0.31.0"}`},
		{name: "models need the key", method: "GET", path: "/v1/models", wantStatus: 401, wantBody: `{"error":"Unauthorized"}`},
		{name: "models", method: "GET", path: "/v1/models", header: keyHeader, wantStatus: 200,
			wantIn: []string{`"id":"m"`, `"owned_by":"vllm"`, `"root":"/models/m"`, `"parent":null`, `"max_model_len":8192`, `"permission":[`}},
		{name: "metrics are open", method: "GET", path: "/metrics", wantStatus: 200,
			wantIn: []string{`vllm:num_requests_running{engine="0",model_name="m"} 0`, `vllm:num_requests_waiting{engine="0",model_name="m"} 0`, "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total"}},
		{name: "unknown model", method: "POST", path: "/v1/chat/completions", body: chatBody("other", "hi", nil), header: keyHeader, wantStatus: 404,
			wantIn: []string{`"type":"NotFoundError"`, `"code":404`, "The model `other` does not exist."}},
		{name: "bad request", method: "POST", path: "/v1/chat/completions", body: `{"model":"m","messages":[]}`, header: keyHeader, wantStatus: 400,
			wantIn: []string{`"type":"BadRequestError"`}},
		{name: "unknown path", method: "GET", path: "/nope", wantStatus: 404, wantBody: `{"detail":"Not Found"}`},
		{name: "dev routes need dev mode", method: "POST", path: "/sleep?level=1", wantStatus: 404},
		{name: "dev routes need dev mode (is_sleeping)", method: "GET", path: "/is_sleeping", wantStatus: 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body, _ := do(t, c.method, te.url+c.path, c.body, c.header)
			if status != c.wantStatus {
				t.Fatalf("%s %s = %d %s, want %d", c.method, c.path, status, body, c.wantStatus)
			}
			if c.wantBody != "" || (c.wantIn == nil && c.wantStatus == 200) {
				if got := strings.TrimSpace(string(body)); got != c.wantBody {
					t.Fatalf("body %q, want %q", got, c.wantBody)
				}
			}
			for _, s := range c.wantIn {
				if !strings.Contains(string(body), s) {
					t.Fatalf("body lacks %q:\n%s", s, body)
				}
			}
		})
	}
}

func TestVLLM_ChatRequestIDAndStream(t *testing.T) {
	te, _ := vllmEngine(t, fakeengine.VLLMOptions{}, fakeengine.Config{Tokens: 3})
	status, body, _ := do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hi", nil), map[string]string{"Authorization": "Bearer k", "X-Request-Id": "abc"})
	if status != 200 || !strings.Contains(string(body), `"id":"chatcmpl-abc"`) || !strings.Contains(string(body), `"usage":{`) {
		t.Fatalf("chat: %d %s", status, body)
	}
	status, body, h := do(t, "POST", te.url+"/v1/chat/completions",
		chatBody("m", "hi", map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}), keyHeader)
	if status != 200 || h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", status, h.Get("Content-Type"))
	}
	evs := sseEvents(t, body)
	// role chunk, 3 tokens, finish chunk, usage chunk, [DONE]
	if len(evs) != 7 || evs[len(evs)-1] != "[DONE]" || !strings.Contains(evs[0], `"role":"assistant"`) ||
		!strings.Contains(evs[5], `"choices":[]`) || !strings.Contains(evs[5], `"usage":{`) {
		t.Fatalf("events %q", evs)
	}
}

func TestVLLM_RefusesWhileLoading(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "go")
	e, err := fakeengine.New(fakeengine.Config{ServedName: "m", Flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{}), HoldStartupFile: hold, Stdout: &syncBuffer{}, Stderr: &syncBuffer{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := fakeengine.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.Serve(ctx, ln) }()
	defer func() { cancel(); <-served }()
	url := "http://" + ln.Addr().String()
	if _, err := http.Get(url + "/health"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("health while loading: %v, want connection refused", err)
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "health 200", func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func TestVLLM_SleepWithoutSleepMode(t *testing.T) {
	te, _ := vllmEngine(t, fakeengine.VLLMOptions{DevMode: true}, fakeengine.Config{})
	status, body, _ := do(t, "POST", te.url+"/sleep?level=1", "", nil)
	if status != 500 || !strings.Contains(string(body), "Sleep mode is not enabled") {
		t.Fatalf("sleep without sleep mode: %d %s", status, body)
	}
}

func TestVLLM_SleepLevel1(t *testing.T) {
	g, dev := newSimGPU(t, 1000)
	te, f := vllmEngine(t, fakeengine.VLLMOptions{DevMode: true, SleepMode: true}, fakeengine.Config{
		Sim: fakeengine.SimConfig{StatePath: g.Path(), Visible: dev.UUID, Weights: 400, KV: 200, ParkResidue: 30},
	})
	_, before := chat(t, te, "Say ready.")
	if status, _, _ := do(t, "POST", te.url+"/sleep?level=1", "", nil); status != 200 {
		t.Fatalf("sleep: %d", status)
	}
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"park_residue": 30}) {
		t.Fatalf("asleep: %v", got)
	}
	// Level 1 keeps the weights, in host RAM.
	if n := f.Offloaded(); n != 400 {
		t.Fatalf("offloaded %d bytes at level 1, want the weights' 400", n)
	}
	if _, body, _ := do(t, "GET", te.url+"/is_sleeping", "", nil); strings.TrimSpace(string(body)) != `{"is_sleeping":true}` {
		t.Fatalf("is_sleeping: %s", body)
	}
	// /health stays 200 while asleep, and a request waits for the wake.
	if status, _, _ := do(t, "GET", te.url+"/health", "", nil); status != 200 {
		t.Fatalf("health asleep: %d", status)
	}
	answered := make(chan string, 1)
	go func() { _, text := chat(t, te, "Say ready."); answered <- text }()
	waitFor(t, "a waiting request", func() bool { return te.Stats().Waiting == 1 })

	for _, tag := range []string{"weights", "kv_cache"} {
		if status, _, _ := do(t, "POST", te.url+"/wake_up?tags="+tag, "", nil); status != 200 {
			t.Fatalf("wake %s: %d", tag, status)
		}
	}
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "kv_cache": 200}) {
		t.Fatalf("awake: %v", got)
	}
	if n := f.Offloaded(); n != 0 {
		t.Fatalf("awake, %d bytes still offloaded", n)
	}
	if text := <-answered; text != before {
		t.Fatalf("answer after a level-1 wake %q, before %q", text, before)
	}
	if status, _, _ := do(t, "POST", te.url+"/reset_prefix_cache", "", nil); status != 200 || f.PrefixResets() != 1 {
		t.Fatalf("reset prefix cache: %d %d", status, f.PrefixResets())
	}
}

func TestVLLM_SleepLevel2NeedsReload(t *testing.T) {
	g, dev := newSimGPU(t, 1000)
	te, f := vllmEngine(t, fakeengine.VLLMOptions{DevMode: true, SleepMode: true}, fakeengine.Config{
		Sim: fakeengine.SimConfig{StatePath: g.Path(), Visible: dev.UUID, Weights: 400, KV: 200, ParkResidue: 30},
	})
	_, before := chat(t, te, "Say ready.")
	if status, _, _ := do(t, "POST", te.url+"/sleep?level=2", "", nil); status != 200 {
		t.Fatalf("sleep: %d", status)
	}
	// Level 2 discards the weights: nothing is kept in host RAM.
	if n := f.Offloaded(); n != 0 {
		t.Fatalf("offloaded %d bytes at level 2", n)
	}
	// The reload needs the weights' memory back first.
	if status, _, _ := do(t, "POST", te.url+"/collective_rpc", `{"method":"reload_weights"}`, nil); status != 500 {
		t.Fatalf("reload while asleep: %d", status)
	}
	if status, _, _ := do(t, "POST", te.url+"/wake_up", "", nil); status != 200 {
		t.Fatalf("wake: %d", status)
	}
	if _, text := chat(t, te, "Say ready."); text == before || !f.Stale() {
		t.Fatalf("after a level-2 wake without reload the answer %q should differ from %q", text, before)
	}
	if status, _, _ := do(t, "POST", te.url+"/collective_rpc", `{"method":"nope"}`, nil); status != 500 {
		t.Fatalf("unknown rpc: %d", status)
	}
	if status, body, _ := do(t, "POST", te.url+"/collective_rpc", `{"method":"reload_weights"}`, nil); status != 200 || strings.TrimSpace(string(body)) != `{"results":[null]}` {
		t.Fatalf("reload: %d %s", status, body)
	}
	if _, text := chat(t, te, "Say ready."); text != before {
		t.Fatalf("after the reload %q, want %q", text, before)
	}
}

func TestVLLM_SleepAbortsInFlight(t *testing.T) {
	te, _ := vllmEngine(t, fakeengine.VLLMOptions{DevMode: true, SleepMode: true}, fakeengine.Config{StallAfterTokens: 1})
	s, ready := startStream(t, te.url, chatBody("m", "hi", map[string]any{"stream": true}), keyHeader)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	s.next(t) // role
	s.next(t) // first token, then it stalls
	if status, _, _ := do(t, "POST", te.url+"/sleep?level=1", "", nil); status != 200 {
		t.Fatalf("sleep: %d", status)
	}
	if ev := s.next(t); !strings.Contains(ev, `"finish_reason":"abort"`) {
		t.Fatalf("in-flight request after sleep (mode=abort): %s", ev)
	}
}

func TestVLLM_Determinism(t *testing.T) {
	te, _ := vllmEngine(t, fakeengine.VLLMOptions{}, fakeengine.Config{})
	_, a := chat(t, te, "Say ready.")
	_, b := chat(t, te, "Say ready.")
	if a == "" || a != b {
		t.Fatalf("answers %q %q", a, b)
	}
}

// chat sends a non-streamed chat with the key and returns the status and
// the answer's content.
func chat(t *testing.T, te *testEngine, prompt string) (int, string) {
	t.Helper()
	status, body, _ := do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", prompt, map[string]any{"temperature": 0}), keyHeader)
	var c fakeengine.ChatCompletion
	if status == 200 {
		if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) == 0 {
			t.Fatalf("chat answer %s: %v", body, err)
		}
		return status, c.Choices[0].Message.Content
	}
	return status, string(body)
}
