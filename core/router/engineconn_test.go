// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_EngineClosesAfterEveryStream: an engine that closes the
// connection after every streamed answer while its head says keep-alive
// (llama-server b4748) costs no request: the router never sends on a
// connection the engine closed, and places are all free afterwards.
// Before the check, the pooled connections were reused and their single
// retry took the next pooled one, closed as well: 503 unexpected EOF.
// Under load either defence alone mostly suffices, so each is also pinned
// alone, deterministically: TestEngineClient_NeverWritesOnConnectionEngineClosed
// (the check before reuse) and TestEngineClient_ResendsOnceWhenEngineClosesUnderRequest
// (the one resend).
func TestRouter_EngineClosesAfterEveryStream(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{CloseAfterStream: true, Tokens: 4}})
	const clients, each = 4, 50
	var (
		mu   sync.Mutex
		fail []string
	)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				// Streamed and non-streamed in turn: a non-streamed request
				// sent on a connection a stream's answer left behind.
				stream := (i+c)%2 == 0
				resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(stream, ""), nil)
				if err != nil {
					mu.Lock()
					fail = append(fail, err.Error())
					mu.Unlock()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				ok := resp.StatusCode == 200 && (!stream || strings.HasSuffix(string(b), "data: [DONE]\n\n"))
				if !ok {
					mu.Lock()
					fail = append(fail, fmt.Sprintf("%d %s", resp.StatusCode, b))
					mu.Unlock()
				}
			}
		}(c)
	}
	wg.Wait()
	if len(fail) > 0 {
		t.Fatalf("%d of %d requests failed, first: %s", len(fail), clients*each, fail[0])
	}
	waitFor(t, "every place free", e.idle)
	if n := staleCount(t, e); n == 0 {
		t.Fatal("no stale connection was seen: the engine did not close after its streams, the test proves nothing")
	}
}

// staleCount reads capyctl_engine_connections_stale_total.
func staleCount(t *testing.T, e *env) int {
	t.Helper()
	rec := httptest.NewRecorder()
	e.rt.MetricsHandler().ServeHTTP(rec, &http.Request{Method: "GET", Header: http.Header{}, URL: &url.URL{Path: "/metrics"}})
	m := regexp.MustCompile(`(?m)^capyctl_engine_connections_stale_total (\d+)`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		t.Fatalf("no stale counter in /metrics:\n%s", rec.Body.String())
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestRouter_NonStreamedForwarding: a non-streamed request reaches an
// engine that stops one on a hang-up as it is (the engine does the least
// work), and any other engine as a stream the router assembles; the client
// gets the same answer either way.
func TestRouter_NonStreamedForwarding(t *testing.T) {
	cases := []struct {
		name     string
		forward  bool
		streamed uint64 // streams the engine served
	}{
		{"streamed from an engine that notices hang-ups only while streaming", false, 1},
		{"forwarded to an engine that stops it on a hang-up", true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{engine: fakeengine.Config{Tokens: 5, ServedName: "served-m"}, ep: func(ep *structs.EngineEndpoint) {
				ep.ServedName = "served-m"
				ep.ForwardNonStreamed = c.forward
			}})
			resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			var a struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Model   string `json:"model"`
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
				Capyctl struct {
					Metrics map[string]any `json:"metrics"`
				} `json:"capyctl"`
			}
			if err := json.Unmarshal([]byte(body), &a); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			if a.ID != resp.Header.Get("X-CapyCTL-Request-Id") || a.Object != "chat.completion" || a.Model != "demo" ||
				len(a.Choices) != 1 || a.Choices[0].Message.Content == "" || a.Choices[0].FinishReason != "stop" ||
				a.Usage.CompletionTokens != 5 || a.Capyctl.Metrics == nil {
				t.Fatalf("answer %s", body)
			}
			if s := e.eng.Stats(); s.Total != 1 || s.Streamed != c.streamed {
				t.Fatalf("the engine served %d requests, %d streamed; want 1, %d", s.Total, s.Streamed, c.streamed)
			}
			waitFor(t, "idle", e.idle)
		})
	}
}

// TestRouter_NonStreamedHangupOnLlamaCpp: llama-server b4748 notices a
// non-streamed client's hang-up only after a second without results, so
// under load never; streamed from the router (its driver's declaration),
// an abandoned non-streamed request stops at once even while another
// request streams. Declared wrongly (forwarded as it is), it runs on: the
// declaration is what keeps the engine's work bounded.
func TestRouter_NonStreamedHangupOnLlamaCpp(t *testing.T) {
	cases := []struct {
		name    string
		forward bool
		stops   bool
	}{
		{"streamed from the engine", false, true},
		{"forwarded as it is", true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			llama := fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{ModelPath: "m", Parallel: 2})
			e := newEnv(t, envOpts{
				engine: fakeengine.Config{Flavour: llama, Tokens: 5000, TokenRate: 100, MaxRunning: 2},
				spec:   func(d *structs.Deployment) { d.EngineConfig.MaxConcurrentRequests = 2 },
				ep:     func(ep *structs.EngineEndpoint) { ep.ForwardNonStreamed = c.forward },
			})
			// Another client's stream keeps the engine posting results.
			sctx, scancel := context.WithCancel(context.Background())
			defer scancel()
			go func() {
				if resp, err := e.post(sctx, "/v1/chat/completions", chatBody(true, ""), nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitFor(t, "the stream to run", func() bool { s := e.eng.Stats(); return s.Running == 1 && s.GenerationTokens > 0 })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(false, ""), nil); err == nil {
					resp.Body.Close()
				}
			}()
			waitFor(t, "both to run", func() bool { return e.eng.Stats().Running == 2 })
			cancel()
			<-done
			if c.stops {
				waitFor(t, "the engine to stop the abandoned request", func() bool { s := e.eng.Stats(); return s.Cancelled == 1 && s.Running == 1 })
			} else {
				from := e.eng.Stats().GenerationTokens
				waitFor(t, "250 more tokens", func() bool { return e.eng.Stats().GenerationTokens >= from+250 })
				if s := e.eng.Stats(); s.Cancelled != 0 || s.Running != 2 {
					t.Fatalf("the abandoned request stopped: %+v", s)
				}
			}
			scancel()
			waitFor(t, "idle", e.idle)
		})
	}
}
