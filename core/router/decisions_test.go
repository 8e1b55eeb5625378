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

func decisionEnv(t *testing.T, cfg fakeengine.Config) *env {
	f, err := fakeengine.FlavourByName("decisions")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Flavour = f
	return newEnv(t, envOpts{engine: cfg, api: structs.APIDecisions, ep: func(ep *structs.EngineEndpoint) { ep.RequestIDField = "rid" }})
}

const decisionBody = `{"model":"demo","state":"a calm sea","questions":[{"id":"q","type":"noul","text":"Is it calm?"},{"id":"s","type":"score","text":"How calm?","min":0,"max":3}]}`

func TestRouter_Decisions(t *testing.T) {
	e := decisionEnv(t, fakeengine.Config{})
	resp, err := e.post(context.Background(), decisions.Path, decisionBody, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var out struct {
		decisions.Response
		CapyCTL struct {
			Metrics map[string]struct {
				Value  float64 `json:"value"`
				Source string  `json:"source"`
			} `json:"metrics"`
		} `json:"capyctl"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	var req decisions.Request
	_ = json.Unmarshal([]byte(decisionBody), &req)
	if err := decisions.Check(&req, &out.Response); err != nil {
		t.Fatalf("answer: %v: %s", err, body)
	}
	if out.ID != resp.Header.Get(router.HeaderRequestID) || out.Model != "demo" {
		t.Fatalf("id %q model %q: %s", out.ID, out.Model, body)
	}
	m := out.CapyCTL.Metrics
	if m["total_ms"].Source != "router" || m["engine_ms"].Source != "router" || m["input_tokens"].Source != "engine" || m["prefill_ms"].Source != "engine" {
		t.Fatalf("metrics: %s", body)
	}
	if _, ok := m["ttft_ms"]; ok {
		t.Fatalf("a decision has no first token: %s", body)
	}
	if strings.Contains(body, `"rid"`) {
		t.Fatalf("the engine's request ID field leaked: %s", body)
	}

	// The chat endpoint refuses a decision model by name, waking nothing.
	resp, err = e.post(context.Background(), "/v1/chat/completions", `{"model":"demo","messages":"whatever"}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || errCode(body) != "api_mismatch" || !strings.Contains(body, decisions.Path) {
		t.Fatalf("chat to a decision model: %d %s", resp.StatusCode, body)
	}
	// A bad decision is refused before the engine.
	resp, err = e.post(context.Background(), decisions.Path, `{"model":"demo","state":"x","questions":[{"id":"q","type":"maybe","text":"?"}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || errCode(body) != "invalid_request" {
		t.Fatalf("bad decision: %d %s", resp.StatusCode, body)
	}
	if e.lc.acts.Load() != 0 || e.eng.Stats().Total != 1 {
		t.Fatalf("refusals reached the lifecycle or the engine: %+v", e.eng.Stats())
	}

	// /v1/models shows the API.
	mr, err := http.Get(e.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if mb := readBody(t, mr); !strings.Contains(mb, `"api":"decisions"`) {
		t.Fatalf("models: %s", mb)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_DecisionHangUpCancelsOnTheEngine(t *testing.T) {
	e := decisionEnv(t, fakeengine.Config{StallAfterTokens: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, decisions.Path, decisionBody, nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the engine to work on it", func() bool { return e.eng.Stats().GenerationTokens >= 1 })
	cancel()
	<-done
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	e.settleAfterCuts(t)
}
