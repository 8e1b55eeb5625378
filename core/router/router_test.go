// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

type answer struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage   map[string]any `json:"usage"`
	CapyCTL struct {
		Metrics map[string]struct {
			Value  float64 `json:"value"`
			Source string  `json:"source"`
		} `json:"metrics"`
	} `json:"capyctl"`
}

func TestRouter_NonStreamedAnswer(t *testing.T) {
	e := newEnv(t, envOpts{})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), map[string]string{"X-Request-Id": "client-7"})
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var a answer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	id := resp.Header.Get(router.HeaderRequestID)
	if id == "" || a.ID != id {
		t.Fatalf("id %q, header %q", a.ID, id)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "client-7" {
		t.Fatalf("X-Request-Id = %q", got)
	}
	if a.Object != "chat.completion" || a.Model != "demo" || len(a.Choices) != 1 || a.Choices[0].Message.Content == "" || a.Choices[0].FinishReason == "" {
		t.Fatalf("answer %+v", a)
	}
	m := a.CapyCTL.Metrics
	for name, src := range map[string]string{"total_ms": "router", "queue_ms": "router", "engine_ms": "router", "ttft_ms": "router", "input_tokens": "engine", "output_tokens": "engine"} {
		if m[name].Source != src {
			t.Fatalf("metric %s = %+v, want source %s (all: %s)", name, m[name], src, body)
		}
	}
	for _, absent := range []string{"activation_ms", "prefill_ms", "cached_tokens"} {
		if _, ok := m[absent]; ok {
			t.Fatalf("unknown figure %s shown: %s", absent, body)
		}
	}
	// The engine streamed it (always stream from the engine).
	if s := e.eng.Stats(); s.Completed != 1 {
		t.Fatalf("engine stats %+v", s)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_StreamedAnswer(t *testing.T) {
	cases := []struct {
		name      string
		extra     string
		wantUsage bool
	}{
		{"without usage", "", false},
		{"with usage", `,"stream_options":{"include_usage":true}`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, c.extra), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			id := resp.Header.Get(router.HeaderRequestID)
			data, comments := sseLines(body)
			if len(data) < 3 || data[len(data)-1] != "[DONE]" {
				t.Fatalf("stream %q", body)
			}
			usage := false
			for _, d := range data[:len(data)-1] {
				var ch struct {
					ID      string            `json:"id"`
					Model   string            `json:"model"`
					Choices []json.RawMessage `json:"choices"`
					Usage   json.RawMessage   `json:"usage"`
				}
				if err := json.Unmarshal([]byte(d), &ch); err != nil {
					t.Fatalf("chunk %q: %v", d, err)
				}
				if ch.ID != id || ch.Model != "demo" {
					t.Fatalf("chunk id %q model %q, want %q demo", ch.ID, ch.Model, id)
				}
				if len(ch.Choices) == 0 && len(ch.Usage) > 0 {
					usage = true
				}
			}
			if usage != c.wantUsage {
				t.Fatalf("usage chunk %v, want %v: %s", usage, c.wantUsage, body)
			}
			i := strings.Index(body, ": x-capyctl-metrics {")
			if i < 0 || i > strings.Index(body, "data: [DONE]") || len(comments) != 1 {
				t.Fatalf("no metrics comment before [DONE]: %s", body)
			}
			var m map[string]struct {
				Value  float64 `json:"value"`
				Source string  `json:"source"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(comments[0], ": x-capyctl-metrics ")), &m); err != nil || m["ttft_ms"].Source != "router" || m["input_tokens"].Source != "engine" {
				t.Fatalf("metrics %q: %v", comments[0], err)
			}
			waitFor(t, "idle", e.idle)
		})
	}
}

func TestRouter_BadInput(t *testing.T) {
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.MaxBodyBytes = 4096 }})
	cases := []struct {
		name   string
		path   string
		body   string
		hdr    map[string]string
		status int
		code   string
	}{
		{"not JSON", "/v1/chat/completions", "this is not json", nil, 400, "invalid_request"},
		{"no model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request"},
		// The engines read field names exactly (pydantic): so does the router.
		{"model in capitals", "/v1/chat/completions", `{"MODEL":"demo","messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request"},
		{"Model", "/v1/chat/completions", `{"Model":"demo","messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request"},
		{"decision with MODEL", "/v1/systemone", `{"MODEL":"demo","questions":[]}`, nil, 400, "invalid_request"},
		{"no messages", "/v1/chat/completions", `{"model":"demo"}`, nil, 400, "invalid_request"},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil, 404, "unknown_model"},
		{"n above 1", "/v1/chat/completions", chatBody(false, `,"n":2`), nil, 400, "unsupported_parameter"},
		{"bad client request id", "/v1/chat/completions", chatBody(false, ""), map[string]string{"X-Request-Id": "has space"}, 400, "invalid_request"},
		{"too large", "/v1/chat/completions", chatBody(false, `,"pad":"`+strings.Repeat("x", 5000)+`"`), nil, 413, "request_too_large"},
		{"decision to a chat model", "/v1/systemone", `{"model":"demo","questions":"not even a list"}`, nil, 400, "api_mismatch"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := e.post(context.Background(), c.path, c.body, c.hdr)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != c.status || errCode(body) != c.code {
				t.Fatalf("got %d %s, want %d %s", resp.StatusCode, body, c.status, c.code)
			}
			if resp.Header.Get(router.HeaderRequestID) == "" {
				t.Fatal("no request ID on an error answer")
			}
			if c.code == "api_mismatch" && !strings.Contains(body, "/v1/chat/completions") {
				t.Fatalf("api_mismatch does not name the right endpoint: %s", body)
			}
		})
	}
	if n := e.lc.acts.Load(); n != 0 {
		t.Fatalf("bad input woke the model %d times", n)
	}
	if s := e.eng.Stats(); s.Total != 0 {
		t.Fatalf("bad input reached the engine: %+v", s)
	}
}

func TestRouter_HangUpCancelsOnTheEngine(t *testing.T) {
	cases := []struct {
		name    string
		stream  bool
		forward bool // the engine stops a non-streamed request on a hang-up
		engine  fakeengine.Config
		settle  string // what the cut waits for
		started func(e *env) bool
	}{
		{
			name: "mid-stream", stream: true, engine: fakeengine.Config{StallAfterTokens: 3}, settle: "settle_when_idle",
			started: func(e *env) bool { return e.eng.Stats().GenerationTokens >= 3 },
		},
		{
			name: "during a non-streamed answer", stream: false, engine: fakeengine.Config{StallAfterTokens: 3}, settle: "settle_when_idle",
			started: func(e *env) bool { return e.eng.Stats().GenerationTokens >= 3 },
		},
		{
			name: "during a non-streamed answer forwarded as it is", stream: false, forward: true,
			engine: fakeengine.Config{StallAfterTokens: 3}, settle: "settle_when_idle",
			started: func(e *env) bool { return e.eng.Stats().GenerationTokens >= 3 },
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{engine: c.engine, ep: func(ep *structs.EngineEndpoint) { ep.ForwardNonStreamed = c.forward }})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := e.post(ctx, "/v1/chat/completions", chatBody(c.stream, ""), nil)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitFor(t, "the engine to generate", func() bool { return c.started(e) })
			e.lc.noReading.Store(true)
			hungUp := time.Now()
			cancel()
			<-done
			waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
			s := e.eng.Stats()
			if s.Running != 0 || s.LastCancelUnixNano < hungUp.UnixNano() {
				t.Fatalf("engine %+v", s)
			}
			e.heldUntilReading(t, router.OutcomeCancelled, 1)
			e.settleAfterCuts(t)
		})
	}
}

func TestRouter_HangUpBeforeTheFirstTokenSettlesOnTheIdleReading(t *testing.T) {
	// One engine slot, held by a first request: the second waits in the
	// engine's own queue and gets nothing, not even the answer's head.
	e := newEnv(t, envOpts{engine: fakeengine.Config{MaxRunning: 1, StallAfterTokens: 1}})
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	go func() {
		if resp, err := e.post(ctx1, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the first request to run", func() bool { return e.eng.Stats().Running == 1 })
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx2, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the second request to wait on the engine", func() bool { return e.eng.Stats().Waiting == 1 })
	e.lc.noReading.Store(true)
	cancel2()
	<-done
	waitFor(t, "the engine to drop it", func() bool { s := e.eng.Stats(); return s.Waiting == 0 && s.Cancelled == 1 })
	// The engine may have had it: its place stays held until the engine's
	// load reading shows no more requests than the router still serves
	// there. The first request still runs, so the engine never reads
	// idle; the reading "one running, none waiting" against one live
	// request is the evidence.
	e.heldUntilReading(t, router.OutcomeCancelled, 1)
	waitFor(t, "the cut request to settle while the first still runs", func() bool {
		return e.count("settle_when_idle") == 0 && e.count("settle_at_stop") == 0 && e.count("in_flight") == 1
	})
	if s := e.eng.Stats(); s.Running != 1 {
		t.Fatalf("the first request no longer runs: %+v", s)
	}
	cancel1()
	waitFor(t, "idle", e.idle)
	if e.lc.restarts.Load() != 0 {
		t.Fatal("the instance was restarted: a cut request waited for a stop")
	}
}

func TestRouter_HangUpWhileQueued(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{StallAfterTokens: 1},
		spec:   func(d *structs.Deployment) { d.EngineConfig.MaxConcurrentRequests = 1 },
	})
	ctx1, cancel1 := context.WithCancel(context.Background())
	go func() {
		if resp, err := e.post(ctx1, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the first request to run", func() bool { return e.eng.Stats().Running == 1 })
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx2, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the second to wait in the line", func() bool { return e.count("waiting") == 1 })
	cancel2()
	<-done
	waitFor(t, "the line to empty", func() bool { return e.count("waiting") == 0 })
	cancel1()
	waitFor(t, "idle", e.idle)
	if s := e.eng.Stats(); s.Total != 1 {
		t.Fatalf("the queued request reached the engine: %+v", s)
	}
}

func TestRouter_HangUpWhileWaking(t *testing.T) {
	e := newEnv(t, envOpts{noReady: true})
	entered := make(chan struct{}, 1)
	gotCancel := make(chan struct{})
	e.lc.mu.Lock()
	e.lc.activate = func(ctx context.Context, dep string) error {
		entered <- struct{}{}
		<-ctx.Done()
		close(gotCancel)
		return ctx.Err()
	}
	e.lc.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	cancel()
	<-done
	<-gotCancel
	waitFor(t, "idle", e.idle)
	if s := e.eng.Stats(); s.Total != 0 {
		t.Fatalf("engine saw the request: %+v", s)
	}
}

func TestRouter_HangUpBeforeAdmission(t *testing.T) {
	e := newEnv(t, envOpts{})
	u, _ := url.Parse(e.srv.URL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	// The body is announced but never finished: the client hangs up while
	// the router still reads it.
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":\"demo\"")
	c.Close()
	waitFor(t, "the request to be counted as cancelled", func() bool {
		return strings.Contains(scrape(t, e), `capyctl_requests_total{api="chat",deployment="",outcome="cancelled"} 1`)
	})
	if s := e.eng.Stats(); s.Total != 0 || e.lc.acts.Load() != 0 {
		t.Fatalf("a request hung up before admission reached the engine: %+v", s)
	}
}

func scrape(t testing.TB, e *env) string {
	rec := &recorder{h: http.Header{}}
	e.rt.MetricsHandler().ServeHTTP(rec, &http.Request{Method: "GET", Header: http.Header{}, URL: &url.URL{Path: "/metrics"}})
	return rec.b.String()
}

type recorder struct {
	h http.Header
	b strings.Builder
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(p []byte) (int, error) { return r.b.Write(p) }
func (r *recorder) WriteHeader(int)             {}

func TestRouter_AbortByRequestID(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{StallAfterTokens: 2},
		ep: func(ep *structs.EngineEndpoint) {
			ep.RequestIDHeader = "X-Request-Id"
			ep.AbortByID = true
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	done := make(chan struct{})
	first := make(chan struct{})
	var requestID string
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			requestID = resp.Header.Get(router.HeaderRequestID)
			var b [1]byte
			_, _ = resp.Body.Read(b[:])
			close(first)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	select {
	case <-first:
	case <-done:
		t.Fatal("the stream failed before its first byte")
	}
	waitFor(t, "generation", func() bool { return e.eng.Stats().GenerationTokens >= 2 })
	cancel()
	within(t, "the client to hang up", done)
	waitFor(t, "the abort", func() bool { return e.lc.aborts.Load() == 1 })
	// The abort names the request that was cut, not any request.
	if ids := e.lc.abortedIDs(); len(ids) != 1 || requestID == "" || ids[0] != requestID {
		t.Fatalf("aborted %q, want the cut request %q", ids, requestID)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_EngineStallsMidStream(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{StallAfterTokens: 2},
		spec:   func(d *structs.Deployment) { d.Limits.StreamIdle = structs.Duration(50 * time.Millisecond) },
	})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	data, _ := sseLines(body)
	if len(data) < 2 || data[len(data)-1] != "[DONE]" || errCode(data[len(data)-2]) != "stream_stalled" {
		t.Fatalf("stream %q", body)
	}
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	waitFor(t, "idle", e.idle)
}

func TestRouter_ChunkOverTheBound(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			// The engine stalls after the big chunk, so that it is still
			// working when the router cuts.
			e := newEnv(t, envOpts{engine: fakeengine.Config{BigChunkBytes: 70 << 10, StallAfterTokens: 2}})
			resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(stream, ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if stream {
				data, _ := sseLines(body)
				if len(data) < 2 || data[len(data)-1] != "[DONE]" || errCode(data[len(data)-2]) != "chunk_too_large" {
					t.Fatalf("stream %q", body)
				}
			} else if resp.StatusCode != 502 || errCode(body) != "chunk_too_large" {
				t.Fatalf("got %d %s", resp.StatusCode, body)
			}
			waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
			waitFor(t, "idle", e.idle)
		})
	}
}

func TestRouter_FortyEngineErrorsDoNotLockTheModel(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{FailRequests: 40}})
	for i := 0; i < 40; i++ {
		resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(i%2 == 0, ""), nil)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != 502 || errCode(body) != "engine_error" || !strings.Contains(body, "fake engine failure") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 {
		t.Fatalf("after 40 engine errors: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_ClientThatStopsReading(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{Tokens: 5_000_000},
		spec:   func(d *structs.Deployment) { d.Limits.ClientReadIdle = structs.Duration(100 * time.Millisecond) },
	})
	u, _ := url.Parse(e.srv.URL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	body := chatBody(true, "")
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Never read: the router's writes block, its client bound ends the
	// stream, and the engine is cancelled.
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	waitFor(t, "the outcome", func() bool {
		return strings.Contains(scrape(t, e), `outcome="client_read_idle"} 1`)
	})
	waitFor(t, "idle", e.idle)
}

func TestRouter_ThreeHundredClientsAgainstThirtyTwoPlaces(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{StallAfterTokens: 1, MaxRunning: 300},
		spec: func(d *structs.Deployment) {
			d.EngineConfig.MaxConcurrentRequests = 32
			d.Limits.MaxWaiting = 64
		},
	})
	var wg sync.WaitGroup
	var refused, badRefusal atomic.Int64
	// The clients' own deadline: a test that goes wrong ends its 300
	// requests and fails, instead of hanging until the package timeout.
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 300}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(true, "")))
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode == 429 {
				refused.Add(1)
				b, _ := io.ReadAll(resp.Body)
				if errCode(string(b)) != "queue_full" || resp.Header.Get("Retry-After") == "" {
					badRefusal.Add(1)
				}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
	}
	waitFor(t, "32 running, 64 waiting, 204 refused", func() bool {
		return e.eng.Stats().Running == 32 && e.count("in_flight") == 32 && e.count("waiting") == 64 && refused.Load() == 204
	})
	if s := e.eng.Stats(); s.Running != 32 || s.Waiting != 0 {
		t.Fatalf("engine %+v", s)
	}
	if badRefusal.Load() != 0 {
		t.Fatalf("%d refusals without queue_full and Retry-After", badRefusal.Load())
	}
	cancel()
	within(t, "the 300 clients to end", wgDone(&wg))
	e.settleAfterCuts(t)
	if s := e.eng.Stats(); s.Total < 32 || s.Total > 96 {
		t.Fatalf("engine saw %d requests", s.Total)
	}
}

func TestRouter_ProgressWhileWaking(t *testing.T) {
	e := newEnv(t, envOpts{noReady: true, router: func(c *router.Config) { c.ProgressAfter = time.Millisecond }})
	release := make(chan struct{})
	e.lc.mu.Lock()
	e.lc.activate = func(ctx context.Context, dep string) error {
		select {
		case <-release:
			e.publish(true)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.lc.mu.Unlock()
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, err := resp.Body.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), ": capyctl progress {\"state\":\"starting\"") {
		t.Fatalf("first bytes %q: %v", buf[:n], err)
	}
	close(release)
	rest := readBody(t, resp)
	data, _ := sseLines(rest)
	if len(data) < 3 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream after the progress: %q", rest)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_CutsWaitingToSettleAtStopRestartTheInstance(t *testing.T) {
	// Two places on an engine without a load reading; both requests are
	// cut before the engine answered anything (they wait in the engine's
	// queue behind a busy slot): with a third request waiting, the
	// instance is restarted.
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{MaxRunning: 1, StallAfterTokens: 1},
		spec:   func(d *structs.Deployment) { d.EngineConfig.MaxConcurrentRequests = 2 },
	})
	// An engine without a load reading: nothing but its next stop proves
	// that a request it may have had is over.
	e.lc.noIdle.Store(true)
	// Occupy the engine's only slot from outside the router.
	hold, holdCancel := context.WithCancel(context.Background())
	defer holdCancel()
	go func() {
		req, _ := http.NewRequestWithContext(hold, http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the engine's slot to be taken", func() bool { return e.eng.Stats().Running == 1 })
	for i := 0; i < 2; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
				resp.Body.Close()
			}
		}()
		waitFor(t, "the request to wait on the engine", func() bool { return e.eng.Stats().Waiting == 1 })
		cancel()
		<-done
		waitFor(t, "it to be cut", func() bool { return e.count("settle_at_stop") == i+1 })
		// The engine learns of the hang-up on its own time: until it has,
		// its queue still counts this request, and the next round would
		// take that for its own request and cut it before it was sent.
		waitFor(t, "the engine to drop the cut request", func() bool { return e.eng.Stats().Waiting == 0 })
	}
	ctx3, cancel3 := context.WithCancel(context.Background())
	third := make(chan int, 1)
	go func() {
		resp, err := e.post(ctx3, "/v1/chat/completions", chatBody(true, ""), nil)
		if err != nil {
			third <- 0
			return
		}
		third <- resp.StatusCode
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	defer cancel3()
	waitFor(t, "the restart", func() bool { return e.lc.restarts.Load() == 1 })
	holdCancel()
	// The restart made a new generation: the route table shows it, which
	// settles the cut requests and serves the third.
	e.publish(true)
	if code := <-third; code != 200 {
		t.Fatalf("the waiting request got %d after the restart", code)
	}
	cancel3()
	// The third, cut in its turn on an engine without a load reading, waits
	// for the next stop (or was settled by the restart, when it got its
	// place on the old launch before the new table was published).
	e.lc.state.Store(structs.StateStopped)
	waitFor(t, "idle", e.idle)
}

// TestRouter_RestartSettlesBeforeReady: cut requests waiting for the next
// stop settle once the instance's launch changed, while the new launch
// still starts (before the route table shows it ready).
func TestRouter_RestartSettlesBeforeReady(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{StallAfterTokens: 3}})
	e.lc.noIdle.Store(true) // no idle signal: a cut waits for the next stop
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the engine to generate", func() bool { return e.eng.Stats().GenerationTokens >= 3 })
	cancel()
	<-done
	waitFor(t, "the cut to wait for the next stop", func() bool { return e.count("settle_at_stop") == 1 })
	// The instance restarts: a new launch, starting, not yet routable.
	e.lc.state.Store(structs.StateStarting)
	e.lc.gen.Add(1)
	e.publish(false)
	waitFor(t, "the cut of the old launch to settle", func() bool { return e.count("settle_at_stop") == 0 })
}

// TestRouter_OneUnknownReadingIsNotNoIdleSignal: an engine whose load
// reading is unknown once (then idle) still settles a cut on its idle
// reading; only noIdleReadings unknown readings in a row make the cut wait
// for the next stop.
func TestRouter_OneUnknownReadingIsNotNoIdleSignal(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{StallAfterTokens: 3}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the engine to generate", func() bool { return e.eng.Stats().GenerationTokens >= 3 })
	e.lc.unknownReadings.Store(1)
	cancel()
	<-done
	e.settleAfterCuts(t)
}
