// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

func TestEngine_ChatCompletion(t *testing.T) {
	te := startEngine(t, fakeengine.Config{Tokens: 6}, true)
	cases := []struct {
		name       string
		body       string
		wantTokens int
		wantFinish string
		wantPrompt int
	}{
		{name: "natural length", body: chatBody("m", "tell me a story", nil), wantTokens: 6, wantFinish: "stop", wantPrompt: 4 + 4},
		{name: "max_tokens cuts", body: chatBody("m", "tell me a story", map[string]any{"max_tokens": 2}), wantTokens: 2, wantFinish: "length", wantPrompt: 8},
		{name: "max_tokens above length", body: chatBody("m", "hi", map[string]any{"max_tokens": 100}), wantTokens: 6, wantFinish: "stop", wantPrompt: 5},
		{name: "max_completion_tokens wins", body: chatBody("m", "hi", map[string]any{"max_tokens": 5, "max_completion_tokens": 3}), wantTokens: 3, wantFinish: "length", wantPrompt: 5},
		{name: "temperature is ignored", body: chatBody("m", "hi", map[string]any{"temperature": 1.7}), wantTokens: 6, wantFinish: "stop", wantPrompt: 5},
		{
			name:       "content parts and several messages",
			body:       `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"one two"},{"type":"text","text":"three"}]}]}`,
			wantTokens: 6, wantFinish: "stop", wantPrompt: (2 + 4) + (3 + 4),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, data := te.chat(t, c.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, data)
			}
			var got fakeengine.ChatCompletion
			var raw map[string]any
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal(data, &raw)
			for _, k := range []string{"id", "object", "created", "model", "choices", "usage"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("field %q missing in %s", k, data)
				}
			}
			if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Object != "chat.completion" || got.Model != "m" || got.Created == 0 {
				t.Errorf("header fields: %+v", got)
			}
			if len(got.Choices) != 1 {
				t.Fatalf("choices: %s", data)
			}
			ch := got.Choices[0]
			if ch.Index != 0 || ch.Message == nil || ch.Message.Role != "assistant" || ch.FinishReason != c.wantFinish {
				t.Errorf("choice: %s", data)
			}
			if n := len(strings.Fields(ch.Message.Content)); n != c.wantTokens {
				t.Errorf("content %q has %d words, want %d", ch.Message.Content, n, c.wantTokens)
			}
			u := got.Usage
			if u == nil || u.CompletionTokens != c.wantTokens || u.PromptTokens != c.wantPrompt || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("usage %+v, want %d completion and %d prompt tokens", u, c.wantTokens, c.wantPrompt)
			}
		})
	}
}

func TestEngine_ChatStream(t *testing.T) {
	te := startEngine(t, fakeengine.Config{Tokens: 5}, true)
	cases := []struct {
		name         string
		extra        map[string]any
		includeUsage bool
		wantTokens   int
		wantFinish   string
	}{
		{name: "plain", extra: map[string]any{}, wantTokens: 5, wantFinish: "stop"},
		{name: "include_usage", extra: map[string]any{"stream_options": map[string]any{"include_usage": true}}, includeUsage: true, wantTokens: 5, wantFinish: "stop"},
		{name: "include_usage false", extra: map[string]any{"stream_options": map[string]any{"include_usage": false}}, wantTokens: 5, wantFinish: "stop"},
		{name: "cut by max_tokens", extra: map[string]any{"max_tokens": 3, "stream_options": map[string]any{"include_usage": true}}, includeUsage: true, wantTokens: 3, wantFinish: "length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			extra := map[string]any{"stream": true}
			for k, v := range c.extra {
				extra[k] = v
			}
			status, data, h := do(t, http.MethodPost, te.url+"/v1/chat/completions", chatBody("m", "stream me", extra), nil)
			if status != http.StatusOK || h.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q: %s", status, h.Get("Content-Type"), data)
			}
			events := sseEvents(t, data)
			want := 1 + c.wantTokens + 1 + 1 // role, tokens, finish, [DONE]
			if c.includeUsage {
				want++
			}
			if len(events) != want {
				t.Fatalf("%d events, want %d:\n%s", len(events), want, data)
			}
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", events[len(events)-1])
			}
			var chunks []map[string]any
			for _, ev := range events[:len(events)-1] {
				var m map[string]any
				if err := json.Unmarshal([]byte(ev), &m); err != nil {
					t.Fatalf("event %q: %v", ev, err)
				}
				if m["object"] != "chat.completion.chunk" || m["id"] != chunks0(chunks, m)["id"] || m["model"] != "m" {
					t.Fatalf("chunk header: %v", m)
				}
				chunks = append(chunks, m)
			}
			choice := func(m map[string]any) map[string]any {
				cs := m["choices"].([]any)
				if len(cs) != 1 {
					t.Fatalf("chunk choices: %v", m)
				}
				return cs[0].(map[string]any)
			}
			if d := choice(chunks[0])["delta"]; !reflect.DeepEqual(d, map[string]any{"role": "assistant"}) {
				t.Fatalf("first chunk delta %v, want the role only", d)
			}
			var text strings.Builder
			for _, m := range chunks[1 : 1+c.wantTokens] {
				ch := choice(m)
				if ch["finish_reason"] != nil {
					t.Fatalf("content chunk with a finish reason: %v", m)
				}
				text.WriteString(ch["delta"].(map[string]any)["content"].(string))
			}
			fin := choice(chunks[1+c.wantTokens])
			if fin["finish_reason"] != c.wantFinish || !reflect.DeepEqual(fin["delta"], map[string]any{}) {
				t.Fatalf("finish chunk %v", fin)
			}
			for _, m := range chunks[:2+c.wantTokens] {
				if _, ok := m["usage"]; ok {
					t.Fatalf("usage on an ordinary chunk: %v", m)
				}
			}
			if c.includeUsage {
				u := chunks[len(chunks)-1]
				if cs, ok := u["choices"].([]any); !ok || len(cs) != 0 {
					t.Fatalf("usage chunk choices %v, want []", u["choices"])
				}
				usage := u["usage"].(map[string]any)
				if usage["completion_tokens"] != float64(c.wantTokens) || usage["total_tokens"] != usage["prompt_tokens"].(float64)+float64(c.wantTokens) {
					t.Fatalf("usage %v", usage)
				}
			}
			// The streamed text is the non-streamed answer.
			delete(extra, "stream")
			delete(extra, "stream_options")
			_, whole := te.chat(t, chatBody("m", "stream me", extra))
			var cc fakeengine.ChatCompletion
			json.Unmarshal(whole, &cc)
			if text.String() != cc.Choices[0].Message.Content {
				t.Fatalf("streamed %q, whole %q", text.String(), cc.Choices[0].Message.Content)
			}
		})
	}
}

// chunks0 is the first chunk, or m itself when there is none yet.
func chunks0(chunks []map[string]any, m map[string]any) map[string]any {
	if len(chunks) == 0 {
		return m
	}
	return chunks[0]
}

func TestEngine_Errors(t *testing.T) {
	te := startEngine(t, fakeengine.Config{}, true)
	cases := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantType   string
		wantCode   string
	}{
		{name: "wrong model", method: "POST", path: "/v1/chat/completions", body: chatBody("other", "hi", nil), wantStatus: 404, wantType: "invalid_request_error", wantCode: "model_not_found"},
		{name: "bad json", method: "POST", path: "/v1/chat/completions", body: `{"model":"m","messages":[`, wantStatus: 400, wantType: "invalid_request_error"},
		{name: "empty body", method: "POST", path: "/v1/chat/completions", body: "", wantStatus: 400, wantType: "invalid_request_error"},
		{name: "no messages", method: "POST", path: "/v1/chat/completions", body: `{"model":"m","messages":[]}`, wantStatus: 400, wantType: "invalid_request_error"},
		{name: "ill-typed field", method: "POST", path: "/v1/chat/completions", body: `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, wantStatus: 400, wantType: "invalid_request_error"},
		{name: "max_tokens zero", method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", map[string]any{"max_tokens": 0}), wantStatus: 400, wantType: "invalid_request_error"},
		{name: "unknown route", method: "GET", path: "/v2/nothing", wantStatus: 404, wantType: "invalid_request_error", wantCode: "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, data, h := do(t, c.method, te.url+c.path, c.body, nil)
			if status != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", status, c.wantStatus, data)
			}
			if h.Get("Content-Type") != "application/json" {
				t.Errorf("content type %q", h.Get("Content-Type"))
			}
			var env fakeengine.OpenAIError
			if err := json.Unmarshal(data, &env); err != nil || env.Error.Message == "" {
				t.Fatalf("envelope %s: %v", data, err)
			}
			if env.Error.Type != c.wantType || env.Error.Code != c.wantCode {
				t.Fatalf("type %q code %q, want %q %q", env.Error.Type, env.Error.Code, c.wantType, c.wantCode)
			}
		})
	}
	if s := te.Stats(); s.Total != 0 {
		t.Fatalf("refused requests counted: %+v", s)
	}
}

func TestEngine_Auth(t *testing.T) {
	const key = "sk-test-123"
	cases := []struct {
		name       string
		key        string
		method     string
		path       string
		body       string
		auth       string
		wantStatus int
	}{
		{name: "no key configured", method: "GET", path: "/v1/models", wantStatus: 200},
		{name: "health is public", key: key, method: "GET", path: "/health", wantStatus: 200},
		{name: "models without header", key: key, method: "GET", path: "/v1/models", wantStatus: 401},
		{name: "models with wrong key", key: key, method: "GET", path: "/v1/models", auth: "Bearer nope", wantStatus: 401},
		{name: "models with a prefix of the key", key: key, method: "GET", path: "/v1/models", auth: "Bearer sk-test", wantStatus: 401},
		{name: "models with the key", key: key, method: "GET", path: "/v1/models", auth: "Bearer " + key, wantStatus: 200},
		{name: "scheme is case-insensitive", key: key, method: "GET", path: "/v1/models", auth: "bearer " + key, wantStatus: 200},
		{name: "key without scheme", key: key, method: "GET", path: "/v1/models", auth: key, wantStatus: 401},
		{name: "chat without header", key: key, method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", nil), wantStatus: 401},
		{name: "chat with the key", key: key, method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", nil), auth: "Bearer " + key, wantStatus: 200},
		{name: "metrics need the key", key: key, method: "GET", path: "/metrics", wantStatus: 401},
		{name: "stats need the key", key: key, method: "GET", path: "/fake/stats", wantStatus: 401},
		{name: "unknown route needs the key", key: key, method: "GET", path: "/nope", wantStatus: 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			te := startEngine(t, fakeengine.Config{APIKey: c.key}, true)
			h := map[string]string{}
			if c.auth != "" {
				h["Authorization"] = c.auth
			}
			status, data, _ := do(t, c.method, te.url+c.path, c.body, h)
			if status != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", status, c.wantStatus, data)
			}
			if status == 401 {
				var env fakeengine.OpenAIError
				if err := json.Unmarshal(data, &env); err != nil || env.Error.Code != "invalid_api_key" {
					t.Fatalf("401 body %s", data)
				}
			}
		})
	}
}

func TestEngine_Determinism(t *testing.T) {
	answer := func(t *testing.T, cfg fakeengine.Config, messages string) string {
		te := startEngine(t, cfg, true)
		status, data := te.chat(t, `{"model":"`+te.ServedName()+`","temperature":1.5,"messages":`+messages+`}`)
		if status != 200 {
			t.Fatalf("%d %s", status, data)
		}
		var cc fakeengine.ChatCompletion
		json.Unmarshal(data, &cc)
		return cc.Choices[0].Message.Content
	}
	base := answer(t, fakeengine.Config{}, `[{"role":"user","content":"what is a capybara"}]`)
	cases := []struct {
		name     string
		cfg      fakeengine.Config
		messages string
		same     bool
	}{
		{name: "same everything", messages: `[{"role":"user","content":"what is a capybara"}]`, same: true},
		{name: "earlier messages do not count", messages: `[{"role":"system","content":"x"},{"role":"user","content":"what is a capybara"},{"role":"assistant","content":"y"}]`, same: true},
		{name: "other prompt", messages: `[{"role":"user","content":"what is a river"}]`},
		{name: "other seed", cfg: fakeengine.Config{Seed: 7}, messages: `[{"role":"user","content":"what is a capybara"}]`},
		{name: "other served name", cfg: fakeengine.Config{ServedName: "m2"}, messages: `[{"role":"user","content":"what is a capybara"}]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := answer(t, c.cfg, c.messages)
			if (got == base) != c.same {
				t.Fatalf("answer %q vs base %q, want same=%v", got, base, c.same)
			}
		})
	}
}

func TestEngine_Loading(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "go")
	te := startEngine(t, fakeengine.Config{HoldStartupFile: hold}, false)
	cases := []struct {
		method, path, body string
		wantBody           string
	}{
		{method: "GET", path: "/health", wantBody: `{"status":"loading"}`},
		{method: "GET", path: "/v1/models"},
		{method: "POST", path: "/v1/chat/completions", body: chatBody("m", "hi", nil)},
	}
	for _, c := range cases {
		status, data, _ := do(t, c.method, te.url+c.path, c.body, nil)
		if status != http.StatusServiceUnavailable {
			t.Fatalf("%s while loading: %d %s", c.path, status, data)
		}
		if c.wantBody != "" && strings.TrimSpace(string(data)) != c.wantBody {
			t.Fatalf("%s while loading: %s", c.path, data)
		}
	}
	if te.Phase() != fakeengine.PhaseLoading {
		t.Fatalf("phase %s", te.Phase())
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	<-te.Ready()
	status, data, _ := do(t, "GET", te.url+"/health", "", nil)
	if status != 200 || strings.TrimSpace(string(data)) != `{"status":"ok"}` {
		t.Fatalf("health when ready: %d %s", status, data)
	}
	status, data, _ = do(t, "GET", te.url+"/v1/models", "", nil)
	var list fakeengine.ModelList
	json.Unmarshal(data, &list)
	want := fakeengine.ModelList{Object: "list", Data: []fakeengine.ModelCard{{ID: "m", Object: "model", Created: te.Created().Unix(), OwnedBy: "fake"}}}
	if status != 200 || !reflect.DeepEqual(list, want) {
		t.Fatalf("models: %d %s", status, data)
	}
}

// queueEngine starts an engine with one slot whose answers stall after one
// token, so that requests stay running until the client hangs up.
func queueEngine(t *testing.T) *testEngine {
	return startEngine(t, fakeengine.Config{MaxRunning: 1, StallAfterTokens: 1}, true)
}

// gauges reads the queue gauges from /metrics.
func (te *testEngine) gauges(t *testing.T) (running, waiting float64) {
	m := te.metrics(t)
	return m["fake:requests_running"], m["fake:requests_waiting"]
}

func TestEngine_QueueGauges(t *testing.T) {
	te := queueEngine(t)
	body := chatBody("m", "wait for me", map[string]any{"stream": true})

	a, aReady := startStream(t, te.url, body, nil)
	if err := <-aReady; err != nil {
		t.Fatal(err)
	}
	a.next(t) // role
	a.next(t) // the one token before the stall
	b, bReady := startStream(t, te.url, body, nil)
	waitFor(t, "b waiting", func() bool { r, w := te.gauges(t); return r == 1 && w == 1 })
	c, cReady := startStream(t, te.url, body, nil)
	waitFor(t, "c waiting", func() bool { r, w := te.gauges(t); return r == 1 && w == 2 })

	// A hangs up: its slot goes to b, the first in line.
	a.cancel()
	if err := <-bReady; err != nil {
		t.Fatal(err)
	}
	b.next(t) // role
	b.next(t) // its token
	waitFor(t, "b running, c waiting", func() bool { r, w := te.gauges(t); return r == 1 && w == 1 })
	select {
	case <-cReady:
		t.Fatal("c got a slot before b gave it back")
	default:
	}
	if s := te.stats(t); s.Cancelled != 1 || s.Total != 3 || s.LastCancelUnixNano == 0 {
		t.Fatalf("stats after a's hang-up: %+v", s)
	}
	m := te.metrics(t)
	if m["fake:requests_cancelled_total"] != 1 || m["fake:requests_total"] != 3 || m["fake:generation_tokens_total"] != 2 {
		t.Fatalf("counters %v", m)
	}

	b.cancel()
	if err := <-cReady; err != nil {
		t.Fatal(err)
	}
	c.next(t)
	c.cancel()
	waitFor(t, "an idle engine", func() bool {
		s := te.Stats()
		return s.Running == 0 && s.Waiting == 0 && s.Cancelled == 3
	})
}

func TestEngine_CancelWhileWaiting(t *testing.T) {
	te := queueEngine(t)
	body := chatBody("m", "hi", map[string]any{"stream": true})
	a, aReady := startStream(t, te.url, body, nil)
	if err := <-aReady; err != nil {
		t.Fatal(err)
	}
	b, bReady := startStream(t, te.url, body, nil)
	waitFor(t, "b waiting", func() bool { return te.Stats().Waiting == 1 })
	b.cancel()
	if err := <-bReady; err == nil {
		t.Fatal("b got an answer")
	}
	waitFor(t, "b gone from the queue", func() bool {
		s := te.Stats()
		return s.Waiting == 0 && s.Running == 1 && s.Cancelled == 1
	})
	a.cancel()
	waitFor(t, "a gone", func() bool { s := te.Stats(); return s.Running == 0 && s.Cancelled == 2 })
}

func TestEngine_CancelNonStreamed(t *testing.T) {
	te := startEngine(t, fakeengine.Config{StallAfterTokens: 2}, true)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", te.url+"/v1/chat/completions", strings.NewReader(chatBody("m", "hi", nil)))
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "the request running", func() bool { return te.Stats().Running == 1 })
	before := time.Now().UnixNano()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request was answered")
	}
	waitFor(t, "the slot idle", func() bool { s := te.Stats(); return s.Running == 0 && s.Cancelled == 1 })
	if s := te.Stats(); s.LastCancelUnixNano < before || s.Completed != 0 {
		t.Fatalf("stats %+v (cancelled after %d)", s, before)
	}
}

func TestEngine_Abort(t *testing.T) {
	te := startEngine(t, fakeengine.Config{StallAfterTokens: 1}, true)
	s, ready := startStream(t, te.url, chatBody("m", "hi", map[string]any{"stream": true}), map[string]string{"X-Request-Id": "req-1"})
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	role := s.next(t)
	if !strings.Contains(role, `"id":"chatcmpl-req-1"`) {
		t.Fatalf("id does not come from X-Request-Id: %s", role)
	}
	s.next(t)
	if n := te.Abort("other"); n != 0 {
		t.Fatalf("aborted %d unrelated requests", n)
	}
	if n := te.Abort("req-1"); n != 1 {
		t.Fatalf("aborted %d, want 1", n)
	}
	if fin := s.next(t); !strings.Contains(fin, `"finish_reason":"abort"`) {
		t.Fatalf("finish chunk %s", fin)
	}
	if done := s.next(t); done != "[DONE]" {
		t.Fatalf("after abort: %s", done)
	}
	waitFor(t, "the slot idle", func() bool { st := te.Stats(); return st.Running == 0 && st.Cancelled == 1 })
}

func TestEngine_FailRequests(t *testing.T) {
	te := startEngine(t, fakeengine.Config{FailRequests: 2}, true)
	cases := []struct {
		name       string
		stream     bool
		wantStatus int
	}{
		{name: "first fails", wantStatus: 500},
		{name: "streamed second fails", stream: true, wantStatus: 500},
		{name: "third succeeds", wantStatus: 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, data := te.chat(t, chatBody("m", "hi", map[string]any{"stream": c.stream}))
			if status != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", status, c.wantStatus, data)
			}
			if status == 500 && strings.TrimSpace(string(data)) != `{"error":{"message":"fake engine failure","type":"server_error"}}` {
				t.Fatalf("body %s", data)
			}
		})
	}
	if s := te.Stats(); s.Failed != 2 || s.Completed != 1 || s.Total != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestEngine_CrashAfter(t *testing.T) {
	cases := []struct {
		name   string
		stream bool
	}{
		{name: "non-streamed"},
		{name: "streamed", stream: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, err := fakeengine.New(fakeengine.Config{ServedName: "m", CrashAfter: 2, Stdout: &syncBuffer{}, Stderr: &syncBuffer{}})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			url := "http://" + ln.Addr().String()
			served := make(chan error, 1)
			go func() { served <- e.Serve(context.Background(), ln) }()
			<-e.Ready()
			for i := range 2 {
				status, data, _ := do(t, "POST", url+"/v1/chat/completions", chatBody("m", "hi", map[string]any{"stream": c.stream}), nil)
				if status != 200 {
					t.Fatalf("request %d: %d %s", i, status, data)
				}
				if c.stream {
					if ev := sseEvents(t, data); ev[len(ev)-1] != "[DONE]" {
						t.Fatalf("request %d: stream cut: %s", i, data)
					}
				}
			}
			var x *fakeengine.ExitError
			select {
			case err := <-served:
				if !errors.As(err, &x) || x.Code != 1 {
					t.Fatalf("Serve = %v, want exit code 1", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("engine did not crash")
			}
			if _, err := http.Get(url + "/health"); err == nil {
				t.Fatal("engine still answers after the crash")
			}
		})
	}
}

func TestEngine_BigChunk(t *testing.T) {
	const n = 100_000
	te := startEngine(t, fakeengine.Config{BigChunkBytes: n, Tokens: 2}, true)
	_, data, _ := do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hi", map[string]any{"stream": true}), nil)
	events := sseEvents(t, data)
	var chunk fakeengine.ChatCompletionChunk
	if err := json.Unmarshal([]byte(events[1]), &chunk); err != nil {
		t.Fatal(err)
	}
	if got := len(chunk.Choices[0].Delta.Content); got != n {
		t.Fatalf("first content chunk has %d bytes, want %d", got, n)
	}
	if len(events) != 1+3+1+1 {
		t.Fatalf("%d events", len(events))
	}
}

func TestEngine_Logs(t *testing.T) {
	te := startEngine(t, fakeengine.Config{APIKey: "sk-visible", LogSecret: true}, true)
	do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "my-private-prompt", nil), map[string]string{"Authorization": "Bearer sk-visible"})
	out := te.stdout.String() + te.stderr.String()
	for _, want := range []string{"INFO ", "ready", "api key: sk-visible"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "my-private-prompt") {
		t.Fatalf("logs show the prompt:\n%s", out)
	}
}

func TestEngine_ExitDuringStartup(t *testing.T) {
	code := 7
	errOut := &syncBuffer{}
	e, err := fakeengine.New(fakeengine.Config{ServedName: "m", ExitDuringStartup: &code, Stdout: &syncBuffer{}, Stderr: errOut})
	if err != nil {
		t.Fatal(err)
	}
	err = e.Run(context.Background())
	var x *fakeengine.ExitError
	if !errors.As(err, &x) || x.Code != 7 {
		t.Fatalf("Run = %v, want exit code 7", err)
	}
	if !strings.Contains(errOut.String(), "ERROR") {
		t.Fatalf("no error line on stderr: %q", errOut)
	}
	if e.Phase() != fakeengine.PhaseStopped {
		t.Fatalf("phase %s", e.Phase())
	}
}

func TestNew(t *testing.T) {
	cases := []struct {
		name    string
		cfg     fakeengine.Config
		wantErr bool
	}{
		{name: "minimal", cfg: fakeengine.Config{ServedName: "m"}},
		{name: "no served name", cfg: fakeengine.Config{}, wantErr: true},
		{name: "negative tokens", cfg: fakeengine.Config{ServedName: "m", Tokens: -1}, wantErr: true},
		{name: "negative rate", cfg: fakeengine.Config{ServedName: "m", TokenRate: -1}, wantErr: true},
		{name: "negative sim size", cfg: fakeengine.Config{ServedName: "m", Sim: fakeengine.SimConfig{Weights: -1}}, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, err := fakeengine.New(c.cfg)
			if (err != nil) != c.wantErr {
				t.Fatalf("New err = %v, want error %v", err, c.wantErr)
			}
			if err == nil {
				got := e.Config()
				if got.Tokens != fakeengine.DefaultTokens || got.MaxRunning != fakeengine.DefaultMaxRunning || e.Flavour().Name() != "openai" {
					t.Fatalf("defaults not applied: %+v", got)
				}
			}
		})
	}
}

// newSimGPU creates a one-device simulated GPU of total bytes.
func newSimGPU(t *testing.T, total int64) (*simgpu.GPU, simgpu.Device) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "simgpu.json")
	dev := simgpu.DefaultDevices(1, total)[0]
	if err := simgpu.Create(path, []simgpu.Device{dev}); err != nil {
		t.Fatal(err)
	}
	g, err := simgpu.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return g, dev
}

// held is what this process holds on the device, per tag.
func held(t *testing.T, g *simgpu.GPU) map[string]int64 {
	t.Helper()
	st, err := g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, a := range st.Allocations {
		if a.PID == os.Getpid() {
			out[a.Tag] += a.Bytes
		}
	}
	return out
}

func TestEngine_SimulatedMemory(t *testing.T) {
	g, dev := newSimGPU(t, 1000)
	hold := filepath.Join(t.TempDir(), "go")
	te := startEngine(t, fakeengine.Config{
		HoldStartupFile: hold,
		Sim:             fakeengine.SimConfig{StatePath: g.Path(), Visible: dev.UUID, Weights: 400, KV: 200, StartupPeak: 100, ParkResidue: 30},
	}, false)
	waitFor(t, "startup allocations", func() bool { return len(held(t, g)) == 3 })
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "kv_cache": 200, "startup_peak": 100}) {
		t.Fatalf("during loading: %v", got)
	}
	os.WriteFile(hold, nil, 0o600)
	<-te.Ready()
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "kv_cache": 200}) {
		t.Fatalf("when ready: %v", got)
	}

	if err := te.Park(1, fakeengine.TagKVCache); err != nil {
		t.Fatal(err)
	}
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "park_residue": 30}) {
		t.Fatalf("kv cache parked: %v", got)
	}
	if err := te.Park(2); err != nil {
		t.Fatal(err)
	}
	if err := te.Park(1, "cuda_graph"); err == nil {
		t.Fatal("park of an unknown tag accepted")
	}
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"park_residue": 30}) {
		t.Fatalf("parked: %v", got)
	}
	// A request while parked waits for the wake.
	answered := make(chan int, 1)
	go func() {
		status, _, _ := do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hi", nil), nil)
		answered <- status
	}()
	waitFor(t, "a waiting request", func() bool { return te.Stats().Waiting == 1 })

	// Someone else takes memory: waking the weights no longer fits.
	other := os.Getpid()
	if err := g.Allocate(other, dev.UUID, "intruder", 700); err != nil {
		t.Fatal(err)
	}
	if err := te.Wake(); !errors.Is(err, simgpu.ErrOutOfMemory) {
		t.Fatalf("Wake = %v, want out of memory", err)
	}
	if te.Phase() != fakeengine.PhaseParked {
		t.Fatalf("phase after failed wake: %s", te.Phase())
	}
	if err := g.Free(other, "intruder"); err != nil {
		t.Fatal(err)
	}
	if err := te.Wake(fakeengine.TagWeights); err != nil {
		t.Fatal(err)
	}
	if te.Phase() != fakeengine.PhaseParked {
		t.Fatal("awake with the KV cache still released")
	}
	if err := te.Wake(fakeengine.TagKVCache); err != nil {
		t.Fatal(err)
	}
	if got := held(t, g); !reflect.DeepEqual(got, map[string]int64{"weights": 400, "kv_cache": 200}) {
		t.Fatalf("awake: %v", got)
	}
	if status := <-answered; status != 200 {
		t.Fatalf("request parked then woken: %d", status)
	}
	if s := te.Stats(); s.Parks != 1 || s.Wakes != 1 || s.Phase != "ready" || s.ParkLevel != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestEngine_SimulatedOutOfMemory(t *testing.T) {
	g, dev := newSimGPU(t, 1000)
	errOut := &syncBuffer{}
	e, err := fakeengine.New(fakeengine.Config{
		ServedName: "m", Stdout: &syncBuffer{}, Stderr: errOut,
		Sim: fakeengine.SimConfig{StatePath: g.Path(), Visible: "0", Weights: 600, StartupPeak: 300, KV: 200},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = e.Run(context.Background())
	var x *fakeengine.ExitError
	if !errors.As(err, &x) || x.Code != 1 {
		t.Fatalf("Run = %v, want exit code 1", err)
	}
	if !strings.Contains(errOut.String(), "CUDA out of memory. Tried to allocate") {
		t.Fatalf("no CUDA-like line: %q", errOut)
	}
	if got := held(t, g); len(got) != 0 {
		t.Fatalf("memory left after the failed start: %v", got)
	}
	_ = dev
}

// loadsFirst is a flavour that does not answer while loading, as vLLM.
type loadsFirst struct{ fakeengine.OpenAI }

func (loadsFirst) AcceptWhileLoading() bool { return false }

func TestListen(t *testing.T) {
	cases := []struct {
		name          string
		flavour       fakeengine.Flavour
		wantRefused   bool
		wantLoadingOK bool
	}{
		{name: "answers while loading", flavour: fakeengine.OpenAI{}},
		{name: "refuses while loading", flavour: loadsFirst{}, wantRefused: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hold := filepath.Join(t.TempDir(), "go")
			out := &syncBuffer{}
			e, err := fakeengine.New(fakeengine.Config{ServedName: "m", Flavour: c.flavour, HoldStartupFile: hold, Stdout: out, Stderr: &syncBuffer{}})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := fakeengine.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			if strings.HasSuffix(addr, ":0") {
				t.Fatalf("no port chosen: %s", addr)
			}
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- e.Serve(ctx, ln) }()
			defer func() {
				cancel()
				if err := <-served; err != nil {
					t.Errorf("Serve = %v", err)
				}
			}()

			waitFor(t, "the listening line", func() bool { return strings.Contains(out.String(), "listening on "+addr) })
			conn, err := net.Dial("tcp", addr)
			switch {
			case c.wantRefused && !errors.Is(err, syscall.ECONNREFUSED):
				t.Fatalf("dial while loading: %v, want connection refused", err)
			case !c.wantRefused && err != nil:
				t.Fatalf("dial while loading: %v", err)
			case !c.wantRefused:
				conn.Close()
				if status, _, _ := do(t, "GET", "http://"+addr+"/health", "", nil); status != http.StatusServiceUnavailable {
					t.Fatalf("health while loading: %d", status)
				}
			}
			os.WriteFile(hold, nil, 0o600)
			<-e.Ready()
			waitFor(t, "health 200", func() bool {
				resp, err := http.Get("http://" + addr + "/health")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == 200
			})
		})
	}
}

// TestStreamTokenRate_SlowsStreamedAnswersOnly: a streamed answer comes at
// StreamTokenRate (one token per 100 s here: after its first event, the
// role's, nothing more for a while), while a non-streamed one (a driver's
// readiness probe) comes at TokenRate (at once).
func TestStreamTokenRate_SlowsStreamedAnswersOnly(t *testing.T) {
	te := startEngine(t, fakeengine.Config{Tokens: 4, StreamTokenRate: 0.01}, true)
	if status, body := te.chat(t, chatBody("m", "hi", nil)); status != http.StatusOK {
		t.Fatalf("non-streamed: %d %s", status, body)
	}
	s, ready := startStream(t, te.url, chatBody("m", "hi", map[string]any{"stream": true}), nil)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	if first := s.next(t); strings.Contains(first, `"content":"`) && !strings.Contains(first, `"content":""`) {
		t.Fatalf("the first event carries a token: %s", first)
	}
	got := make(chan string, 1)
	go func() {
		line, _ := s.rd.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		t.Fatalf("a token came at once, not at the stream's rate: %q", line)
	case <-time.After(300 * time.Millisecond):
	}
}
