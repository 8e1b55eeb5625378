// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// sseEngine is an engine that answers every chat request with the given
// server-sent events, as the engines stream them (llama-server, vLLM).
func sseEngine(t *testing.T, events ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, ev := range events {
			_, _ = fmt.Fprintf(w, "data: %s\n\n", ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

const roleOnlyChunk = `{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`

// TestRouter_InStreamErrorCodes: an error event in the engine's stream
// before any output is the engine refusing the request when its code says
// the request was invalid (400, 413, 422: engine_rejected), an engine
// error otherwise; a first chunk that carries no output (the role alone)
// is no output.
func TestRouter_InStreamErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		code int
		want string
	}{
		{400, "engine_rejected"}, {413, "engine_rejected"}, {422, "engine_rejected"},
		{500, "engine_error"}, {404, "engine_error"},
	} {
		t.Run(fmt.Sprint(tc.code), func(t *testing.T) {
			srv := sseEngine(t, roleOnlyChunk, fmt.Sprintf(`{"error":{"message":"no","code":%d}}`, tc.code))
			e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.BaseURL = srv.URL }})
			resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			if body := readBody(t, resp); errCode(body) != tc.want {
				t.Fatalf("in-stream error code %d: got %d %s, want %s", tc.code, resp.StatusCode, body, tc.want)
			}
		})
	}
}

// TestDialects_AnswerThatDoesNotParse: an engine's whole answer that is
// not the JSON the dialect translates is an engine error, not an empty
// answer.
func TestDialects_AnswerThatDoesNotParse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","choices":`)
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) {
		ep.BaseURL = srv.URL
		ep.MessagesPath, ep.ResponsesPath = "", ""
	}})
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"demo","max_tokens":50,"messages":[{"role":"user","content":"hello"}]}`},
		{"/v1/responses", `{"model":"demo","input":"hello"}`},
	} {
		resp, err := e.post(context.Background(), tc.path, tc.body, nil)
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != 502 || !strings.Contains(body, "does not parse") {
			t.Errorf("%s: got %d %s, want 502 and the engine's answer that does not parse", tc.path, resp.StatusCode, body)
		}
	}
}

// TestRouter_DoneReachesClientBeforeEngineBodyEnds: the end of a complete
// stream ([DONE]) is flushed to the client as it arrives, not when the
// engine's body ends after it (an engine may keep it open a while). The
// engine here keeps its body open until the client has read [DONE], or
// until the router gives up on its connection.
func TestRouter_DoneReachesClientBeforeEngineBodyEnds(t *testing.T) {
	gotFinish, seen := make(chan struct{}), make(chan struct{})
	heldOpen := make(chan bool, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, roleChunk+contentChunk+strings.TrimSuffix(finishChunk, "data: [DONE]\n\n"))
		w.(http.Flusher).Flush()
		// [DONE] alone, once the rest was relayed: nothing else in the
		// read that brings it is flushed for it.
		select {
		case <-gotFinish:
		case <-r.Context().Done():
			heldOpen <- false
			return
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-seen:
			heldOpen <- true
		case <-r.Context().Done():
			heldOpen <- false
		}
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.BaseURL = srv.URL }})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"finish_reason":"stop"`) {
			close(gotFinish)
		}
		if sc.Text() == "data: [DONE]" {
			break
		}
	}
	close(seen)
	if sc.Err() != nil {
		t.Fatal(sc.Err())
	}
	if !<-heldOpen {
		t.Fatal("[DONE] reached the client only after the router left the engine's body")
	}
}

// TestRouter_FinishedAnswerWhoseBodyBreaksOff: an answer assembled for a
// client that asked for no stream is complete at its finish reason; a body
// that then breaks off (no [DONE], no end of the chunked coding) costs the
// client nothing.
func TestRouter_FinishedAnswerWhoseBodyBreaksOff(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, roleChunk+contentChunk+strings.TrimSuffix(finishChunk, "data: [DONE]\n\n"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection closes amid the chunked body
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.BaseURL = srv.URL }})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"content":"hi"`) || !strings.Contains(body, `"finish_reason":"stop"`) {
		t.Fatalf("got %d %s, want the finished answer", resp.StatusCode, body)
	}
}
