// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/decisions"
)

func completionsBody(stream bool, extra string) string {
	b := `{"model":"demo","prompt":"Once upon a time","max_tokens":5`
	if stream {
		b += `,"stream":true`
	}
	return b + extra + "}"
}

// textCompletion is the part of a text_completion the tests read.
type textCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	CapyCTL *struct {
		Metrics map[string]struct {
			Value  float64 `json:"value"`
			Source string  `json:"source"`
		} `json:"metrics"`
	} `json:"capyctl"`
}

// TestRouter_Completions routes POST /v1/completions to a chat deployment,
// streamed and not, to an engine that stops a non-streamed request on a
// hang-up (forwarded as is) and to one that must stream (streamed from the
// engine and assembled): the answer is a text_completion with the request
// ID and the public model name, the same text either way.
func TestRouter_Completions(t *testing.T) {
	cases := []struct {
		name    string
		forward bool // the engine's non_streamed_hangup is STOPS
		stream  bool
		extra   string
		// engineStreams: the engine was asked for a stream.
		engineStreams bool
		usageChunk    bool
	}{
		{name: "whole, stops engine", forward: true, stream: false, engineStreams: false},
		{name: "whole, streams engine (assembled)", forward: false, stream: false, engineStreams: true},
		{name: "streamed", forward: false, stream: true, engineStreams: true},
		{name: "streamed with usage", forward: true, stream: true, extra: `,"stream_options":{"include_usage":true}`, engineStreams: true, usageChunk: true},
	}
	var want string // the text, the same for every case (a deterministic engine)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.ForwardNonStreamed = c.forward }})
			resp, err := e.post(context.Background(), "/v1/completions", completionsBody(c.stream, c.extra), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			rid := resp.Header.Get(router.HeaderRequestID)
			if rid == "" {
				t.Fatal("no request ID header")
			}
			var text string
			if !c.stream {
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
					t.Fatalf("content type %q", ct)
				}
				var out textCompletion
				if err := json.Unmarshal([]byte(body), &out); err != nil {
					t.Fatalf("%v: %s", err, body)
				}
				if out.Object != "text_completion" || out.ID != rid || out.Model != "demo" || len(out.Choices) != 1 ||
					out.Choices[0].FinishReason == nil || *out.Choices[0].FinishReason != "length" {
					t.Fatalf("answer: %s", body)
				}
				if out.Usage == nil || out.Usage.CompletionTokens != 5 || out.CapyCTL == nil || out.CapyCTL.Metrics["output_tokens"].Value != 5 ||
					out.CapyCTL.Metrics["ttft_ms"].Source != "router" {
					t.Fatalf("usage or metrics: %s", body)
				}
				text = out.Choices[0].Text
			} else {
				data, _ := sseLines(body)
				if len(data) < 3 || data[len(data)-1] != "[DONE]" {
					t.Fatalf("stream: %s", body)
				}
				sawUsage := false
				for _, d := range data[:len(data)-1] {
					var ch textCompletion
					if err := json.Unmarshal([]byte(d), &ch); err != nil {
						t.Fatalf("%v: %s", err, d)
					}
					if ch.Object != "text_completion" || ch.ID != rid || ch.Model != "demo" {
						t.Fatalf("chunk: %s", d)
					}
					for _, choice := range ch.Choices {
						text += choice.Text
					}
					if ch.Usage != nil {
						sawUsage = true
					}
				}
				if sawUsage != c.usageChunk {
					t.Fatalf("usage chunk %v, want %v: %s", sawUsage, c.usageChunk, body)
				}
			}
			if text == "" || (want != "" && text != want) {
				t.Fatalf("text %q, want %q", text, want)
			}
			want = text
			st := e.eng.Stats()
			if st.Total != 1 || (st.Streamed == 1) != c.engineStreams {
				t.Fatalf("engine stats: %+v", st)
			}
			waitFor(t, "idle", e.idle)
		})
	}
}

// TestRouter_CompletionsHangUpCancelsOnTheEngine: a client that goes away
// ends the text completion on the engine.
func TestRouter_CompletionsHangUpCancelsOnTheEngine(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "streamed", false: "whole"}[stream], func(t *testing.T) {
			e := newEnv(t, envOpts{engine: fakeengine.Config{StallAfterTokens: 1}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := e.post(ctx, "/v1/completions", completionsBody(stream, ""), nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitFor(t, "the engine to work on it", func() bool { return e.eng.Stats().GenerationTokens >= 1 })
			cancel()
			within(t, "the client to end", done)
			waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
			e.settleAfterCuts(t)
		})
	}
}

// TestRouter_CompletionsAPIMismatch: a text completion for a model that
// serves decisions, and a decision for a chat model, are refused with
// api_mismatch before anything wakes.
func TestRouter_CompletionsAPIMismatch(t *testing.T) {
	checkAPIMismatch(t, []apiMismatchCase{
		{name: "completions to a decision model", api: structs.APIDecisions, path: "/v1/completions", body: completionsBody(false, ""), wantEndpoint: decisions.Path},
		{name: "decision to a chat model", api: structs.APIChat, path: decisions.Path, body: decisionBody, wantEndpoint: "/v1/chat/completions"},
	})
}

// TestRouter_ModelsEndpoints: /v1/models says which endpoints each model
// serves.
func TestRouter_ModelsEndpoints(t *testing.T) {
	cases := []struct {
		api  string
		want []string
	}{
		{api: structs.APIChat, want: []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"}},
		{api: structs.APIDecisions, want: []string{decisions.Path}},
		{api: structs.APIEmbeddings, want: []string{"/v1/embeddings"}},
		{api: structs.APIRerank, want: []string{"/v1/rerank"}},
	}
	for _, c := range cases {
		t.Run(c.api, func(t *testing.T) {
			e := newEnv(t, envOpts{api: c.api})
			resp, err := http.Get(e.srv.URL + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			var out struct {
				Data []struct {
					ID      string `json:"id"`
					CapyCTL struct {
						Endpoints []string `json:"endpoints"`
					} `json:"capyctl"`
				} `json:"data"`
			}
			if err := json.Unmarshal([]byte(body), &out); err != nil {
				t.Fatal(err)
			}
			if len(out.Data) != 1 || strings.Join(out.Data[0].CapyCTL.Endpoints, ",") != strings.Join(c.want, ",") {
				t.Fatalf("models: %s", body)
			}
		})
	}
}

// apiMismatchCase is a request sent to a model that serves another API.
type apiMismatchCase struct {
	name, api, path, body, wantEndpoint string
}

// checkAPIMismatch sends each case to a model of the case's API and
// requires a 400 api_mismatch naming the model's endpoint, with a
// request ID, before anything wakes.
func checkAPIMismatch(t *testing.T, cases []apiMismatchCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{api: c.api, noReady: true})
			resp, err := e.post(context.Background(), c.path, c.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 400 || errCode(body) != string(structs.CodeAPIMismatch) || !strings.Contains(body, c.wantEndpoint) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if resp.Header.Get(router.HeaderRequestID) == "" {
				t.Fatal("no request ID on the refusal")
			}
			if e.lc.acts.Load() != 0 || e.eng.Stats().Total != 0 {
				t.Fatalf("the refusal woke something: acts %d, engine %+v", e.lc.acts.Load(), e.eng.Stats())
			}
		})
	}
}

// checkInvalidBeforeWake posts each body to path on a model of the given
// API and requires a 400 invalid_request before the deployment wakes.
func checkInvalidBeforeWake(t *testing.T, api, path string, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		e := newEnv(t, envOpts{api: api, noReady: true})
		resp, err := e.post(context.Background(), path, b, nil)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != 400 || errCode(body) != string(structs.CodeInvalidRequest) {
			t.Fatalf("%s: %d %s", b, resp.StatusCode, body)
		}
		if e.lc.acts.Load() != 0 {
			t.Fatalf("%s: the refusal woke the deployment", b)
		}
	}
}

// checkHangUpClosesOnTheEngine posts body to path on a model of the given
// API whose engine stalls after its first token, hangs up, and requires
// the engine to see the request cancelled, every count to settle, and no
// abort by request ID (the engine never had one for this API).
func checkHangUpClosesOnTheEngine(t *testing.T, api, path, body string) {
	t.Helper()
	e := newEnv(t, envOpts{api: api, engine: fakeengine.Config{StallAfterTokens: 1},
		ep: func(ep *structs.EngineEndpoint) { ep.RequestIDField, ep.AbortByID = "rid", true }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, path, body, nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the engine to work on it", func() bool { return e.eng.Stats().GenerationTokens >= 1 })
	cancel()
	within(t, "the client to end", done)
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	e.settleAfterCuts(t)
	if n := e.lc.aborts.Load(); n != 0 {
		t.Fatalf("%d aborts by request ID for a %s request", n, api)
	}
}

// postForJSON posts body to path, requires a 200 JSON answer with a
// request ID, decodes it into out and returns the body and the request ID.
func postForJSON(t *testing.T, e *env, path, body string, out any) (string, string) {
	t.Helper()
	resp, err := e.post(context.Background(), path, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	rid := resp.Header.Get(router.HeaderRequestID)
	if rid == "" {
		t.Fatal("no request ID header")
	}
	if err := json.Unmarshal([]byte(got), out); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	return got, rid
}
