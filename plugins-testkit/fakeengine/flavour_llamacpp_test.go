// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// llamaEngine starts an engine with the llama.cpp flavour.
func llamaEngine(t *testing.T, o fakeengine.LlamaCppOptions, cfg fakeengine.Config, wait bool) *testEngine {
	t.Helper()
	if o.ModelPath == "" {
		o.ModelPath = "stories260K.gguf"
	}
	cfg.Flavour = fakeengine.NewLlamaCpp(o)
	if cfg.ServedName == "" {
		cfg.ServedName = o.ModelPath
		if o.Alias != "" {
			cfg.ServedName = o.Alias
		}
	}
	if cfg.MaxRunning == 0 {
		cfg.MaxRunning = o.Parallel
	}
	return startEngine(t, cfg, wait)
}

const loadingBody = `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`

// TestLlamaCpp_Loading: the port answers before the model is loaded, and
// every route says 503 Loading model (llamaserver-observed.md, Startup).
func TestLlamaCpp_Loading(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "go")
	te := llamaEngine(t, fakeengine.LlamaCppOptions{Parallel: 2, Metrics: true, Slots: true}, fakeengine.Config{HoldStartupFile: hold, APIKey: "k"}, false)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/health", ""}, {"GET", "/v1/models", ""}, {"GET", "/metrics", ""}, {"GET", "/slots", ""},
		{"GET", "/props", ""}, {"POST", "/v1/chat/completions", chatBody("x", "hi", nil)},
	} {
		status, data, _ := do(t, c.method, te.url+c.path, c.body, nil)
		if status != http.StatusServiceUnavailable || strings.TrimSpace(string(data)) != loadingBody {
			t.Fatalf("%s %s while loading: %d %s", c.method, c.path, status, data)
		}
	}
	status, data, _ := do(t, "GET", te.url+"/", "", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(data), `http-equiv="refresh" content="5"`) {
		t.Fatalf("/ while loading: %d %s", status, data)
	}
	os.WriteFile(hold, nil, 0o600)
	<-te.Ready()
	status, data, h := do(t, "GET", te.url+"/health", "", nil)
	if status != 200 || strings.TrimSpace(string(data)) != `{"status":"ok"}` || h.Get("Server") != "llama.cpp" {
		t.Fatalf("health: %d %s %v", status, data, h)
	}
}

func TestLlamaCpp_ModelsAndNames(t *testing.T) {
	meta := fakeengine.LlamaCppMeta{VocabType: 1, NVocab: 512, NCtxTrain: 2048, NEmbd: 64, NParams: 292800, Size: 1171200}
	t.Run("path as id", func(t *testing.T) {
		te := llamaEngine(t, fakeengine.LlamaCppOptions{Meta: meta}, fakeengine.Config{}, true)
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID      string                  `json:"id"`
				OwnedBy string                  `json:"owned_by"`
				Meta    fakeengine.LlamaCppMeta `json:"meta"`
			} `json:"data"`
		}
		_, data, _ := do(t, "GET", te.url+"/v1/models", "", nil)
		json.Unmarshal(data, &list)
		if len(list.Data) != 1 || list.Data[0].ID != "stories260K.gguf" || list.Data[0].OwnedBy != "llamacpp" || list.Data[0].Meta != meta {
			t.Fatalf("models: %s", data)
		}
		// The answer is named after the request, whatever it names...
		_, body := te.chat(t, chatBody("anything-at-all", "hi", nil))
		if !strings.Contains(string(body), `"model":"anything-at-all"`) {
			t.Fatalf("answer: %s", body)
		}
		// ...or gpt-3.5-turbo without alias and model.
		_, body = te.chat(t, `{"messages":[{"role":"user","content":"hi"}]}`)
		if !strings.Contains(string(body), `"model":"gpt-3.5-turbo"`) {
			t.Fatalf("answer: %s", body)
		}
	})
	t.Run("alias", func(t *testing.T) {
		te := llamaEngine(t, fakeengine.LlamaCppOptions{Alias: "tiny-stories"}, fakeengine.Config{}, true)
		_, data, _ := do(t, "GET", te.url+"/models", "", nil)
		if !strings.Contains(string(data), `"id":"tiny-stories"`) {
			t.Fatalf("models: %s", data)
		}
		_, body := te.chat(t, `{"messages":[{"role":"user","content":"hi"}]}`)
		if !strings.Contains(string(body), `"model":"tiny-stories"`) {
			t.Fatalf("answer: %s", body)
		}
	})
}

func TestLlamaCpp_Chat(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{}, fakeengine.Config{Tokens: 6}, true)
	status, data := te.chat(t, chatBody("x", "Once upon a time", map[string]any{"max_tokens": 4}))
	var c struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct{ Role, Content string }
		} `json:"choices"`
		SystemFingerprint string           `json:"system_fingerprint"`
		Object            string           `json:"object"`
		Usage             fakeengine.Usage `json:"usage"`
		Timings           map[string]any   `json:"timings"`
		ID                string           `json:"id"`
	}
	if err := json.Unmarshal(data, &c); err != nil || status != 200 {
		t.Fatalf("%d %s", status, data)
	}
	if c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 4 || c.Timings["predicted_n"] != float64(4) ||
		c.SystemFingerprint != fakeengine.LlamaCppBuild || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Object != "chat.completion" {
		t.Fatalf("answer %s", data)
	}
	for _, k := range []string{"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"} {
		if _, ok := c.Timings[k]; !ok {
			t.Fatalf("timings lack %s: %s", k, data)
		}
	}
}

// TestLlamaCpp_Stream: no role chunk; the last chunk has an empty delta,
// the finish reason, usage and timings; then [DONE].
func TestLlamaCpp_Stream(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{}, fakeengine.Config{Tokens: 3}, true)
	status, data := te.chat(t, chatBody("x", "hi", map[string]any{"stream": true}))
	if status != 200 {
		t.Fatalf("%d %s", status, data)
	}
	events := sseEvents(t, data)
	if len(events) != 5 || events[4] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	type chunk struct {
		Choices []struct {
			Delta        map[string]string `json:"delta"`
			FinishReason *string           `json:"finish_reason"`
		} `json:"choices"`
		Usage   *fakeengine.Usage `json:"usage"`
		Timings map[string]any    `json:"timings"`
		Object  string            `json:"object"`
		Model   string            `json:"model"`
	}
	for i, ev := range events[:3] {
		var c chunk
		json.Unmarshal([]byte(ev), &c)
		if c.Choices[0].Delta["content"] == "" || c.Choices[0].Delta["role"] != "" || c.Usage != nil || c.Timings != nil || c.Choices[0].FinishReason != nil {
			t.Fatalf("chunk %d: %s", i, ev)
		}
	}
	var last chunk
	json.Unmarshal([]byte(events[3]), &last)
	if len(last.Choices[0].Delta) != 0 || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "stop" ||
		last.Usage == nil || last.Usage.CompletionTokens != 3 || last.Timings["predicted_n"] != float64(3) || last.Object != "chat.completion.chunk" {
		t.Fatalf("last chunk %s", events[3])
	}
	if !strings.Contains(events[3], `"delta":{}`) {
		t.Fatalf("last delta is not empty: %s", events[3])
	}
}

// TestLlamaCpp_Errors: b4748 answers every client error with 500
// server_error.
func TestLlamaCpp_Errors(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{Parallel: 2, NoContextShift: true, CtxSize: 64}, fakeengine.Config{}, true)
	cases := []struct {
		name, method, path, body string
		status                   int
		typ, msg                 string
	}{
		{"bad json", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}`, 500, "server_error", "[json.exception.parse_error"},
		{"not json", "POST", "/v1/chat/completions", `not json`, 500, "server_error", "[json.exception.parse_error"},
		{"no messages", "POST", "/v1/chat/completions", `{"prompt":"hi"}`, 500, "server_error", ""},
		{"n=2", "POST", "/v1/chat/completions", `{"n":2,"messages":[{"role":"user","content":"hi"}]}`, 500, "server_error", "Only one completion choice is allowed"},
		{"over the slot context", "POST", "/v1/chat/completions", chatBody("x", strings.Repeat("word ", 40), nil), 400, "invalid_request_error", "exceeds the available context size"},
		{"unknown path", "GET", "/nope", "", 404, "not_found_error", "File Not Found"},
		{"get on a post route", "GET", "/v1/chat/completions", "", 404, "not_found_error", "File Not Found"},
		{"slots not enabled", "GET", "/slots", "", 501, "not_supported_error", "--slots"},
		{"metrics not enabled", "GET", "/metrics", "", 501, "not_supported_error", "--metrics"},
		{"post props not enabled", "POST", "/props", "{}", 501, "not_supported_error", "--props"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, data, _ := do(t, c.method, te.url+c.path, c.body, nil)
			var e struct {
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			json.Unmarshal(data, &e)
			if status != c.status || e.Error.Code != c.status || e.Error.Type != c.typ || !strings.Contains(e.Error.Message, c.msg) {
				t.Fatalf("%d %s", status, data)
			}
		})
	}
}

func TestLlamaCpp_Auth(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{}, fakeengine.Config{APIKey: "sekrit"}, true)
	for _, p := range []string{"/health", "/v1/health", "/models", "/v1/models"} {
		if status, data, _ := do(t, "GET", te.url+p, "", nil); status != 200 {
			t.Fatalf("%s without a key: %d %s", p, status, data)
		}
	}
	status, data, _ := do(t, "GET", te.url+"/props", "", nil)
	if status != 401 || strings.TrimSpace(string(data)) != `{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}` {
		t.Fatalf("props without a key: %d %s", status, data)
	}
	for _, h := range []map[string]string{{"Authorization": "Bearer sekrit"}, {"X-Api-Key": "sekrit"}} {
		if status, data, _ := do(t, "GET", te.url+"/props", "", h); status != 200 {
			t.Fatalf("props with %v: %d %s", h, status, data)
		}
	}
}

// TestLlamaCpp_SlotsPropsMetrics: with -np 1, one stalled request and one
// waiting read as requests_processing 1 and requests_deferred 1.
func TestLlamaCpp_SlotsPropsMetrics(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{Parallel: 1, CtxSize: 512, Metrics: true, Slots: true}, fakeengine.Config{StallAfterTokens: 1}, true)
	_, data, _ := do(t, "GET", te.url+"/props", "", nil)
	var props struct {
		Default struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots int    `json:"total_slots"`
		BuildInfo  string `json:"build_info"`
	}
	json.Unmarshal(data, &props)
	if props.TotalSlots != 1 || props.Default.NCtx != 512 || props.BuildInfo != fakeengine.LlamaCppBuild {
		t.Fatalf("props %s", data)
	}
	body := chatBody("x", "wait", map[string]any{"stream": true})
	a, aReady := startStream(t, te.url, body, nil)
	if err := <-aReady; err != nil {
		t.Fatal(err)
	}
	a.next(t) // the token before the stall: no role chunk comes first
	b, _ := startStream(t, te.url, body, nil)
	defer b.cancel()
	gauges := func() (float64, float64) {
		m := te.metrics(t)
		return m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]
	}
	waitFor(t, "one processing, one deferred", func() bool { p, d := gauges(); return p == 1 && d == 1 })
	_, data, h := do(t, "GET", te.url+"/metrics", "", nil)
	if h.Get("Process-Start-Time-Unix") == "" || !strings.Contains(string(data), "# TYPE llamacpp:requests_deferred gauge") {
		t.Fatalf("metrics %v %s", h, data)
	}
	status, data, _ := do(t, "GET", te.url+"/slots", "", nil)
	var slots []struct {
		ID           int  `json:"id"`
		NCtx         int  `json:"n_ctx"`
		IsProcessing bool `json:"is_processing"`
	}
	json.Unmarshal(data, &slots)
	if status != 200 || len(slots) != 1 || !slots[0].IsProcessing || slots[0].NCtx != 512 {
		t.Fatalf("slots %d %s", status, data)
	}
	if status, data, _ := do(t, "GET", te.url+"/slots?fail_on_no_slot=1", "", nil); status != 503 || !strings.Contains(string(data), "no slot available") {
		t.Fatalf("fail_on_no_slot: %d %s", status, data)
	}
	a.cancel()
	b.cancel()
	waitFor(t, "idle", func() bool { p, d := gauges(); return p == 0 && d == 0 })
}

func TestLlamaCpp_Decisions(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{Alias: "judge"}, fakeengine.Config{}, true)
	req := decisions.ReadinessRequest("judge")
	min, max := 1, 5
	req.Questions = append(req.Questions,
		decisions.Question{ID: "pick", Type: decisions.TypeChoice, Text: "Which colour?", Options: []string{"blue", "grey"}},
		decisions.Question{ID: "rate", Type: decisions.TypeScore, Text: "How clear?", Min: &min, Max: &max})
	b, _ := json.Marshal(req)
	status, data, _ := do(t, "POST", te.url+decisions.Path, string(b), nil)
	var resp decisions.Response
	if err := json.Unmarshal(data, &resp); err != nil || status != 200 {
		t.Fatalf("%d %s", status, data)
	}
	if err := decisions.Check(req, &resp); err != nil || resp.Object != decisions.Object || resp.Model != "judge" || resp.Answers[2].Expected == nil {
		t.Fatalf("answer %s: %v", data, err)
	}
	if _, ok := resp.Timings["prompt_ms"]; !ok {
		t.Fatalf("no timings: %s", data)
	}
	status, data, _ = do(t, "POST", te.url+decisions.Path, `{"model":"judge","questions":[]}`, nil)
	if status != 500 || !strings.Contains(string(data), "questions") {
		t.Fatalf("invalid decision: %d %s", status, data)
	}
}

// TestLlamaCpp_ClosesAfterStream: like b4748, the fake closes the
// connection after a streamed answer whose head advertised keep-alive, and
// keeps it open after a non-streamed one; the knob does the same for any
// flavour.
func TestLlamaCpp_ClosesAfterStream(t *testing.T) {
	cases := []struct {
		name   string
		start  func(t *testing.T) *testEngine
		stream bool
		closed bool
	}{
		{"llamacpp streamed", func(t *testing.T) *testEngine {
			return llamaEngine(t, fakeengine.LlamaCppOptions{}, fakeengine.Config{Tokens: 3}, true)
		}, true, true},
		{"llamacpp non-streamed", func(t *testing.T) *testEngine {
			return llamaEngine(t, fakeengine.LlamaCppOptions{}, fakeengine.Config{Tokens: 3}, true)
		}, false, false},
		{"openai streamed", func(t *testing.T) *testEngine {
			return startEngine(t, fakeengine.Config{Tokens: 3}, true)
		}, true, false},
		{"openai streamed with the knob", func(t *testing.T) *testEngine {
			return startEngine(t, fakeengine.Config{Tokens: 3, CloseAfterStream: true}, true)
		}, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			te := c.start(t)
			u, _ := url.Parse(te.url)
			conn, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, te.ServedName(), c.stream)
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", u.Host, len(body), body)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.Close {
				t.Fatalf("status %d, close %v: want 200 advertising keep-alive", resp.StatusCode, resp.Close)
			}
			if _, err := io.ReadAll(resp.Body); err != nil {
				t.Fatalf("the answer's body did not end cleanly: %v", err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = br.ReadByte()
			switch {
			case c.closed && err != io.EOF:
				t.Fatalf("after the answer: %v, want EOF (the engine closes the connection)", err)
			case !c.closed && !errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("after the answer: %v, want the connection kept open", err)
			}
		})
	}
}

// TestLlamaCpp_NonStreamedHangupNoticedLate: like b4748, an abandoned
// non-streamed request keeps generating while any other result is posted
// (another request's tokens) and stops once a second passes without one; a
// streamed one stops at its next token.
func TestLlamaCpp_NonStreamedHangupNoticedLate(t *testing.T) {
	te := llamaEngine(t, fakeengine.LlamaCppOptions{Parallel: 2}, fakeengine.Config{Tokens: 5000, TokenRate: 100}, true)
	body := func(stream bool) string {
		return fmt.Sprintf(`{"model":"x","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
	}
	stream, ready := startStream(t, te.url, body(true), nil)
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, te.url+"/v1/chat/completions", strings.NewReader(body(false)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "both requests running", func() bool { return te.Stats().Running == 2 })
	cancel()
	<-done
	// The stream keeps posting results: 250 more tokens (over a second at
	// this rate, for both requests together) and the abandoned request
	// still runs.
	from := te.Stats().GenerationTokens
	waitFor(t, "250 more tokens", func() bool { return te.Stats().GenerationTokens >= from+250 })
	if s := te.Stats(); s.Running != 2 || s.Cancelled != 0 {
		t.Fatalf("the abandoned non-streamed request was noticed while results were posted: %+v", s)
	}
	// The stream's client goes: it stops at once; a second later, with
	// nothing posted, the non-streamed one is noticed too.
	stream.cancel()
	waitFor(t, "both cancelled", func() bool { s := te.Stats(); return s.Running == 0 && s.Cancelled == 2 })
}
