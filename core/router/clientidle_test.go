// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_SlowEngineIsNotAnIdleClient: the client read bound bounds how
// long the client takes to accept what is written, not how long the engine
// takes to send the next chunk. A stream whose engine pauses longer than the
// bound between chunks, read at once by its client, completes.
func TestRouter_SlowEngineIsNotAnIdleClient(t *testing.T) {
	// The bound is well above a write's own time on a loaded machine, the
	// engine's pause three times the bound.
	const bound = 100 * time.Millisecond
	e := newEnv(t, envOpts{engine: fakeengine.Config{Tokens: 3, TokenRate: 10.0 / 3}, // a chunk every 300 ms
		spec: func(d *structs.Deployment) { d.Limits.ClientReadIdle = structs.Duration(bound) }})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") || strings.Contains(body, "client_read_idle") {
		t.Fatalf("a slow engine's stream: %d %q", resp.StatusCode, body)
	}
	if m := scrape(t, e); strings.Contains(m, `outcome="client_read_idle"`) {
		t.Fatalf("counted as an idle client:\n%s", m)
	}
}

// TestRouter_SlowEngineIsNotAnIdleClientOverHTTP2: the same over HTTP/2
// (a server relaying from a host speaks it; so does a TLS listener's
// client), where a write deadline is a timer that resets the stream when
// it fires, written to or not: left on while the router waited for the
// engine, it reset every relayed stream whose engine paused longer than
// the bound (10 s by default) between two chunks.
func TestRouter_SlowEngineIsNotAnIdleClientOverHTTP2(t *testing.T) {
	const bound = 100 * time.Millisecond
	e := newEnv(t, envOpts{engine: fakeengine.Config{Tokens: 3, TokenRate: 10.0 / 3}, // a chunk every 300 ms
		spec: func(d *structs.Deployment) { d.Limits.ClientReadIdle = structs.Duration(bound) }, h2: true})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("answered over HTTP/%d, want 2", resp.ProtoMajor)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") || strings.Contains(body, "client_read_idle") {
		t.Fatalf("a slow engine's stream over HTTP/2: %d %q", resp.StatusCode, body)
	}
}

// TestRouter_StalledStreamErrorReachesAClientThatReads: a stream cut by its
// idle bound, longer than the client read bound, ends with the
// stream_stalled error event and [DONE]: the bound of the write that
// carries them starts with that write, not with the stream's last output.
func TestRouter_StalledStreamErrorReachesAClientThatReads(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{StallAfterTokens: 2},
		spec: func(d *structs.Deployment) {
			d.Limits.ClientReadIdle = structs.Duration(100 * time.Millisecond)
			d.Limits.StreamIdle = structs.Duration(400 * time.Millisecond)
		}})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"stream_stalled"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("a stalled stream: %d %q", resp.StatusCode, body)
	}
}
