// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_EngineErrorKeepsTheConnection: an engine's error answer, read
// to its end, leaves its connection to the pool for the next request (a
// failing model costs no new connection per request); the next request
// goes over it.
func TestRouter_EngineErrorKeepsTheConnection(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{FailRequests: 1}})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 502 || errCode(body) != "engine_error" {
		t.Fatalf("got %d %s, want 502 engine_error", resp.StatusCode, body)
	}
	if n := e.rt.PooledEngineConns(); n != 1 {
		t.Fatalf("%d engine connections pooled after an engine error, want its 1", n)
	}
	resp, err = e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 {
		t.Fatalf("after the engine error: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "idle", e.idle)
}
