// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

func nativeEP(ep *structs.EngineEndpoint) {
	ep.MessagesPath, ep.ResponsesPath, ep.CountTokensPath = "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"
}

// TestDialects_HangUpMidStreamCancelsOnTheEngine: a client of either API
// that goes away mid-stream stops the engine's work, translated or native,
// and its place settles as a chat request's does.
func TestDialects_HangUpMidStreamCancelsOnTheEngine(t *testing.T) {
	cases := []struct {
		name, path, body string
		native           bool
	}{
		{"messages translated", "/v1/messages", `{"model":"demo","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"messages native", "/v1/messages", `{"model":"demo","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, true},
		{"messages not streamed", "/v1/messages", `{"model":"demo","max_tokens":50,"messages":[{"role":"user","content":"hello"}]}`, true},
		{"responses translated", "/v1/responses", `{"model":"demo","input":"hello","stream":true}`, false},
		{"responses native", "/v1/responses", `{"model":"demo","input":"hello","stream":true}`, true},
		{"responses not streamed", "/v1/responses", `{"model":"demo","input":"hello"}`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := vllmFake(50)
			cfg.StallAfterTokens = 3
			e := newEnv(t, envOpts{engine: cfg, ep: func(ep *structs.EngineEndpoint) {
				if c.native {
					nativeEP(ep)
				}
			}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := e.post(ctx, c.path, c.body, nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitFor(t, "the engine to generate", func() bool { return e.eng.Stats().GenerationTokens >= 3 })
			hungUp := time.Now()
			cancel()
			within(t, "the client to end", done)
			waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
			if s := e.eng.Stats(); s.Running != 0 || s.LastCancelUnixNano < hungUp.UnixNano() {
				t.Fatalf("engine %+v", s)
			}
			e.settleAfterCuts(t)
		})
	}
}

// TestDialects_Errors: refusals in each API's shape and status, before
// anything reaches the engine; engine failures in the stream.
func TestDialects_Errors(t *testing.T) {
	e := newEnv(t, envOpts{})
	cases := []struct {
		name, path, body string
		status           int
		want             string // in the answer
	}{
		{"messages unknown model", "/v1/messages", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404, `"type":"not_found_error"`},
		{"messages no max_tokens", "/v1/messages", `{"model":"demo","messages":[{"role":"user","content":"x"}]}`, 400, `"type":"invalid_request_error"`},
		{"messages not JSON", "/v1/messages", `{"model":`, 400, `"code":"invalid_request"`},
		{"messages server tool", "/v1/messages", `{"model":"demo","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`, 400, `"code":"unsupported_parameter"`},
		{"messages document block", "/v1/messages", `{"model":"demo","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, 400, `"code":"unsupported_parameter"`},
		{"messages system role", "/v1/messages", `{"model":"demo","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, 400, `"type":"invalid_request_error"`},
		{"count_tokens without a route", "/v1/messages/count_tokens", `{"model":"demo","messages":[{"role":"user","content":"x"}]}`, 400, `"code":"count_tokens_unsupported"`},
		{"responses unknown model", "/v1/responses", `{"model":"nope","input":"x"}`, 404, `"code":"unknown_model"`},
		{"responses no input", "/v1/responses", `{"model":"demo"}`, 400, `"code":"invalid_request"`},
		{"responses background", "/v1/responses", `{"model":"demo","input":"x","background":true}`, 400, `"code":"unsupported_parameter"`},
		{"responses hosted tool", "/v1/responses", `{"model":"demo","input":"x","tools":[{"type":"web_search"}]}`, 400, `"code":"unsupported_parameter"`},
		{"responses unknown item", "/v1/responses", `{"model":"demo","input":[{"type":"computer_call","id":"c"}]}`, 400, `"code":"unsupported_parameter"`},
		{"responses truncation auto", "/v1/responses", `{"model":"demo","input":"x","truncation":"auto"}`, 400, `"code":"unsupported_parameter"`},
		{"responses previous without a store", "/v1/responses", `{"model":"demo","input":"x","previous_response_id":"resp_1"}`, 404, `"code":"response_not_found"`},
		{"responses relayed member from a client", "/v1/responses", `{"model":"demo","input":"x","capyctl":{"response_id":"resp_1"}}`, 400, `"code":"invalid_request"`},
		// L1: a model named in other letters or twice is refused, as on
		// chat: a reader matching names without regard to case would take
		// the other one.
		{"messages model in other letters", "/v1/messages", `{"model":"nope","Model":"demo","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 400, `"type":"invalid_request_error"`},
		{"responses model twice", "/v1/responses", `{"model":"demo","model":"nope","input":"x"}`, 400, `"code":"invalid_request"`},
		{"responses model in other letters", "/v1/responses", `{"MODEL":"demo","input":"x"}`, 400, `"code":"invalid_request"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := e.post(context.Background(), c.path, c.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != c.status || !strings.Contains(body, c.want) {
				t.Fatalf("got %d %s, want %d with %s", resp.StatusCode, body, c.status, c.want)
			}
			if resp.Header.Get(router.HeaderRequestID) == "" {
				t.Fatal("no request ID")
			}
			if strings.HasPrefix(c.path, "/v1/messages") {
				var env struct {
					Type  string `json:"type"`
					Error struct {
						Type, Message, Code string
					} `json:"error"`
					RequestID string `json:"request_id"`
				}
				if json.Unmarshal([]byte(body), &env) != nil || env.Type != "error" || env.Error.Message == "" || env.RequestID != resp.Header.Get(router.HeaderRequestID) {
					t.Fatalf("not Anthropic's error envelope: %s", body)
				}
			}
		})
	}
	if s := e.eng.Stats(); s.Total != 0 {
		t.Fatalf("a refused request reached the engine: %+v", s)
	}
}

// TestDialects_EngineFailsMidStream: an engine's error event ends a
// Messages stream with Anthropic's error event and a Responses stream
// with response.failed.
func TestDialects_EngineFailsMidStream(t *testing.T) {
	broken := sse(
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`,
		`{"error":{"message":"CUDA out of memory","code":500}}`,
		`[DONE]`)
	// vLLM's own Responses route fails a response with response.failed.
	nativeFailed := sse(
		`response.created|{"type":"response.created","sequence_number":0,"response":{"id":"resp_x","status":"in_progress","output":[]}}`,
		`response.output_text.delta|{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_x","output_index":0,"content_index":0,"delta":"Hi"}`,
		`response.failed|{"type":"response.failed","sequence_number":2,"response":{"id":"resp_x","status":"failed","error":{"code":"server_error","message":"CUDA out of memory"}}}`)
	cases := []struct {
		name, path, body, engine, want string
		native                         bool
	}{
		{"messages", "/v1/messages", `{"model":"demo","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`, broken,
			`event: error` + "\n" + `data: {"type":"error","error":{"type":"api_error","message":"CUDA out of memory","code":"engine_error"}`, false},
		{"responses", "/v1/responses", `{"model":"demo","input":"x","stream":true}`, broken, `"type":"response.failed"`, false},
		{"responses native", "/v1/responses", `{"model":"demo","input":"x","stream":true}`, nativeFailed, `"type":"response.failed"`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eng := newScriptedEngine(t, 200, "text/event-stream", c.engine)
			e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) {
				ep.BaseURL = eng.srv.URL
				if c.native {
					nativeEP(ep)
				}
			}})
			resp, err := e.post(context.Background(), c.path, c.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 200 || !strings.Contains(body, c.want) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if c.path == "/v1/responses" && !strings.Contains(body, `"error":{"code":"engine_error","message":"CUDA out of memory"}`) {
				t.Fatalf("response.failed without the engine's error: %s", body)
			}
		})
	}
}

// TestDialects_PingWhileWaiting: a Messages stream waiting for an
// activation gets Anthropic's ping events (which the SDKs skip) beside
// the progress comments; the answer follows.
func TestDialects_PingWhileWaiting(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, envOpts{noReady: true, router: func(c *router.Config) {
		c.ProgressAfter, c.ProgressEvery = time.Millisecond, 5*time.Millisecond
	}})
	e.lc.mu.Lock()
	e.lc.activate = func(ctx context.Context, dep string) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		e.publish(true)
		return nil
	}
	e.lc.mu.Unlock()
	// A deadline: a stream without pings fails the test instead of
	// waiting forever.
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	resp, err := e.post(ctx, "/v1/messages", `{"model":"demo","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for pings := 0; pings < 2; {
		l, err := br.ReadString('\n')
		if err != nil {
			close(release)
			t.Fatalf("%d pings before %v", pings, err)
		}
		if l == "event: ping\n" {
			pings++
		}
		if strings.HasPrefix(l, "event: message_start") {
			t.Fatal("message_start before the model was ready")
		}
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "event: message_start") || !strings.Contains(string(rest), "event: message_stop") {
		t.Fatalf("no answer after the pings: %s", rest)
	}
}

// TestDialects_CountTokens: the engine's own count (the prompt's tokens as
// its generation counts them), and a build without the route refused.
func TestDialects_CountTokens(t *testing.T) {
	e := newEnv(t, envOpts{engine: vllmFake(5), ep: nativeEP})
	msgs := `"messages":[{"role":"user","content":"What is the weather in Paris today?"}]`
	resp, err := e.post(context.Background(), "/v1/messages/count_tokens", `{"model":"demo",`+msgs+`}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || json.Unmarshal([]byte(body), &count) != nil || count.InputTokens == 0 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, err = e.post(context.Background(), "/v1/messages", `{"model":"demo","max_tokens":5,`+msgs+`}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msg struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	if body := readBody(t, resp); json.Unmarshal([]byte(body), &msg) != nil || msg.Usage.InputTokens != count.InputTokens {
		t.Fatalf("count %d, the generation's prompt %s", count.InputTokens, body)
	}

	// A llama-server build older than the route answers 404.
	eng := newScriptedEngine(t, 404, "application/json", `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`)
	e2 := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) {
		ep.BaseURL, ep.CountTokensPath = eng.srv.URL, "/v1/messages/count_tokens"
	}})
	resp, err = e2.post(context.Background(), "/v1/messages/count_tokens", `{"model":"demo",`+msgs+`}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, `"code":"count_tokens_unsupported"`) || !strings.Contains(body, `"type":"invalid_request_error"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	e2.settleAfterCuts(t)
}

// TestDialects_RequestLog: a dialect request is recorded and counted as a
// chat request is, under its own route.
func TestDialects_RequestLog(t *testing.T) {
	led := &ledger{}
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.RequestLog = led }})
	for _, c := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"demo","input":"secret prompt","stream":true}`},
		{"/v1/messages", `{"model":"demo","max_tokens":5,"messages":[{"role":"user","content":"secret prompt"}]}`},
		{"/v1/messages/count_tokens", `{"model":"demo","messages":[{"role":"user","content":"secret prompt"}]}`},
	} {
		resp, err := e.post(context.Background(), c.path, c.body, nil)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	waitFor(t, "three records", func() bool { return len(led.all()) == 3 })
	recs := led.all()
	want := []struct{ api, outcome string }{{"responses", "completed"}, {"messages", "completed"}, {"count_tokens", "refused"}}
	for i, w := range want {
		r := recs[i]
		if r.API != w.api || r.Outcome != w.outcome || r.Deployment != "demo" || r.ID == "" {
			t.Errorf("record %d: %+v, want %s %s", i, r, w.api, w.outcome)
		}
	}
	if recs[0].PromptTokens == 0 || recs[0].CompletionToks == 0 || !recs[0].Stream {
		t.Errorf("the responses record lacks its usage: %+v", recs[0])
	}
	raw, _ := json.Marshal(recs)
	if strings.Contains(string(raw), "secret prompt") {
		t.Fatalf("the log holds the prompt: %s", raw)
	}
	rec := httptestRecorder(e)
	for _, line := range []string{`api="responses",deployment="demo",outcome="completed"`, `api="messages",deployment="demo",outcome="completed"`} {
		if !strings.Contains(rec, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
}

func httptestRecorder(e *env) string {
	req, _ := http.NewRequest(http.MethodGet, "/metrics", nil)
	w := &bodyRecorder{h: http.Header{}}
	e.rt.MetricsHandler().ServeHTTP(w, req)
	return w.b.String()
}

type bodyRecorder struct {
	h http.Header
	b strings.Builder
}

func (r *bodyRecorder) Header() http.Header         { return r.h }
func (r *bodyRecorder) Write(p []byte) (int, error) { return r.b.Write(p) }
func (r *bodyRecorder) WriteHeader(int)             {}

// callerHeader sets the request's caller from X-Test-Key, as the API's
// authentication would from the key.
func callerHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("X-Test-Key"); k != "" {
			r = r.WithContext(router.WithCaller(r.Context(), router.Caller{Key: k}))
		}
		next.ServeHTTP(w, r)
	})
}

// TestResponses_PreviousResponseID: a stored response continues the
// conversation (its input and output, the tool call and its result), for
// its key only; store false keeps nothing; the store outlives the role's
// restart.
func TestResponses_PreviousResponseID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capyctl.db")
	st, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rs := responses.Open(st, responses.Options{Node: "test"})
	eng := newScriptedEngine(t, 200, "text/event-stream", chatToolCall)
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.BaseURL = eng.srv.URL }, router: func(c *router.Config) { c.Responses = rs },
		wrap: callerHeader})
	post := func(key, body string) (int, map[string]any) {
		t.Helper()
		resp, err := e.post(context.Background(), "/v1/responses", body, map[string]string{"X-Test-Key": key})
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		b := readBody(t, resp)
		_ = json.Unmarshal([]byte(b), &out)
		return resp.StatusCode, out
	}
	// Turn 1: the model calls a function.
	code, r1 := post("alice", `{"model":"demo","instructions":"Only turn 1.","input":"Weather in Paris?","tools":[`+weatherTool+`]}`)
	id1, _ := r1["id"].(string)
	if code != 200 || !strings.HasPrefix(id1, "resp_"+responses.NodeTag("test")) || r1["store"] != true {
		t.Fatalf("turn 1: %d %v", code, r1)
	}
	// Turn 2: the client sends the call's result, naming turn 1.
	eng.setAnswer(chatText)
	code, r2 := post("alice", `{"model":"demo","previous_response_id":"`+id1+`","input":[{"type":"function_call_output","call_id":"call_1","output":"sunny"}],"tools":[`+weatherTool+`]}`)
	if code != 200 || r2["previous_response_id"] != id1 {
		t.Fatalf("turn 2: %d %v", code, r2)
	}
	_, sent := eng.last()
	want := `"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","content":"sunny","tool_call_id":"call_1"}]`
	if !strings.Contains(sent, want) || strings.Contains(sent, "Only turn 1.") {
		t.Fatalf("turn 2 reached the engine as %s", sent)
	}
	// Turn 3 names turn 2: the whole chain.
	code, _ = post("alice", `{"model":"demo","previous_response_id":"`+r2["id"].(string)+`","input":"And tomorrow?"}`)
	_, sent = eng.last()
	if code != 200 || !strings.Contains(sent, `{"role":"assistant","content":"Hello"},{"role":"user","content":"And tomorrow?"}`) || !strings.Contains(sent, `"Weather in Paris?"`) {
		t.Fatalf("turn 3: %d %s", code, sent)
	}
	// Another key cannot read it; store false keeps nothing.
	if code, out := post("bob", `{"model":"demo","previous_response_id":"`+id1+`","input":"x"}`); code != 404 || !strings.Contains(toJSON(out), "response_not_found") {
		t.Fatalf("another key continued alice's response: %d %v", code, out)
	}
	_, r4 := post("alice", `{"model":"demo","input":"x","store":false}`)
	if r4["store"] != false {
		t.Fatalf("store false answered %v", r4)
	}
	if _, err := rs.Get("alice", r4["id"].(string)); !structs.HasCode(err, structs.CodeResponseNotFound) {
		t.Fatalf("a store false response was kept: %v", err)
	}
	// The store outlives a restart: close it (the role stops) and open it
	// again on the same file.
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rs2 := responses.Open(st, responses.Options{Node: "test"})
	defer rs2.Close()
	got, err := rs2.Get("alice", id1)
	if err != nil || !strings.Contains(string(got.Response), `"call_id":"call_1"`) {
		t.Fatalf("after a restart: %v %v", got, err)
	}
}

func toJSON(v any) string { b, _ := json.Marshal(v); return string(b) }
