// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestModelsContain(t *testing.T) {
	cases := []struct {
		name    string
		status  int
		body    string
		model   string
		want    bool
		wantErr string
	}{
		{name: "present", status: 200, body: `{"object":"list","data":[{"id":"a","object":"model"},{"id":"m","object":"model","owned_by":"vllm"}]}`, model: "m", want: true},
		{name: "absent", status: 200, body: `{"object":"list","data":[{"id":"a"}]}`, model: "m"},
		{name: "llama.cpp shape", status: 200, body: `{"models":[{"name":"m"}],"object":"list","data":[{"id":"m","owned_by":"llamacpp","meta":null}]}`, model: "m", want: true},
		{name: "empty list", status: 200, body: `{"data":[]}`, model: "m"},
		{name: "loading", status: 503, body: `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, model: "m", wantErr: "503"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/models" || r.Method != http.MethodGet {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.body)
			}))
			defer srv.Close()
			got, err := ModelsContain(testContext(t), NewEngineClient(srv.URL, "", ""), c.model)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("ModelsContain = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestChatProbe(t *testing.T) {
	cases := []struct {
		name    string
		status  int
		answer  string
		want    string
		wantErr string
	}{
		{name: "content", status: 200, answer: `{"choices":[{"index":0,"message":{"role":"assistant","content":"ready"},"finish_reason":"stop"}]}`, want: "ready"},
		{name: "reasoning_content first", status: 200, answer: `{"choices":[{"message":{"content":null,"reasoning_content":"thinking..."},"finish_reason":"length"}]}`, want: "thinking..."},
		{name: "reasoning field", status: 200, answer: `{"choices":[{"message":{"content":"","reasoning":"hmm"}}]}`, want: "hmm"},
		{name: "content parts", status: 200, answer: `{"choices":[{"message":{"content":[{"type":"text","text":"O"},{"type":"text","text":"K"}]}}]}`, want: "OK"},
		{name: "empty answer", status: 200, answer: `{"choices":[{"message":{"content":"  "},"finish_reason":"length"}]}`, wantErr: `empty chat answer (finish_reason "length")`},
		{name: "no choices", status: 200, answer: `{"choices":[]}`, wantErr: "no choices"},
		{name: "error in a 200", status: 200, answer: `{"error":{"message":"boom"}}`, wantErr: "boom"},
		{name: "engine error", status: 400, answer: `{"error":{"code":400,"message":"the request exceeds the available context size","type":"invalid_request_error"}}`, wantErr: "engine answered 400 to POST /v1/chat/completions: the request exceeds"},
		{name: "not json", status: 200, answer: `<html>`, wantErr: "decode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var req map[string]any
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer key" || r.Header.Get("Content-Type") != "application/json" {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				_ = json.NewDecoder(r.Body).Decode(&req)
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.answer)
			}))
			defer srv.Close()
			c2 := NewEngineClient(srv.URL, "Authorization", "Bearer key")
			got, err := ChatProbe(testContext(t), c2, "/v1/chat/completions", "served", "Say ready.", 8)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("err = %v, want %q", err, c.wantErr)
				}
			} else if err != nil || got != c.want {
				t.Errorf("ChatProbe = %q, %v; want %q", got, err, c.want)
			}
			if req["model"] != "served" || req["temperature"] != float64(0) || req["max_tokens"] != float64(8) || req["stream"] != false {
				t.Errorf("request %v", req)
			}
			msgs, _ := req["messages"].([]any)
			if len(msgs) != 1 || msgs[0].(map[string]any)["content"] != "Say ready." {
				t.Errorf("messages %v", req["messages"])
			}
		})
	}
}

func TestChatProbeExtra(t *testing.T) {
	var req map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&req)
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"OK"}}]}`)
	}))
	defer srv.Close()
	extra := map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}, "rid": "probe-1"}
	got, err := ChatProbeExtra(testContext(t), NewEngineClient(srv.URL, "", ""), "/v1/chat/completions", "m", "reply exactly OK", 8, extra)
	if err != nil || got != "OK" {
		t.Fatalf("ChatProbeExtra = %q, %v", got, err)
	}
	kw, _ := req["chat_template_kwargs"].(map[string]any)
	if req["rid"] != "probe-1" || kw["enable_thinking"] != false {
		t.Errorf("request %v", req)
	}
}

func TestRerankProbe(t *testing.T) {
	cases := []struct {
		name, answer, want, wantErr string
		status                      int
	}{
		{name: "scores", status: 200, answer: `{"results":[{"index":1,"document":{"text":"b"},"relevance_score":0.75},{"index":0,"relevance_score":0.25}]}`,
			want: `[{"index":1,"relevance_score":0.75},{"index":0,"relevance_score":0.25}]`},
		{name: "no results", status: 200, answer: `{"results":[]}`, wantErr: "no score"},
		{name: "no score", status: 200, answer: `{"results":[{"index":0}]}`, wantErr: "no score"},
		{name: "not started with --reranking", status: 501, answer: `{"error":{"code":501,"message":"This server does not support reranking. Start it with ` + "`--reranking`" + `","type":"not_supported_error"}}`, wantErr: "engine answered 501 to POST /v1/rerank"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var req map[string]any
			var path string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				path = r.URL.Path
				_ = json.NewDecoder(r.Body).Decode(&req)
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.answer)
			}))
			defer srv.Close()
			got, err := RerankProbe(testContext(t), NewEngineClient(srv.URL, "", ""), "served", "q", []string{"a", "b"})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("err = %v, want %q", err, c.wantErr)
				}
			} else if err != nil || got != c.want {
				t.Errorf("RerankProbe = %q, %v; want %q", got, err, c.want)
			}
			docs, _ := req["documents"].([]any)
			if path != RerankPath || req["model"] != "served" || req["query"] != "q" || len(docs) != 2 {
				t.Errorf("request %s %v", path, req)
			}
		})
	}
}
