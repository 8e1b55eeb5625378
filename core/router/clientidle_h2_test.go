// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_ClientThatStopsReadingOverHTTP2: over HTTP/2 a client that
// reads the head and then stops reading is still ended by
// client_read_idle and its engine cancelled: the bound of a write is set
// before the flush that blocks on the client's flow-control window and
// cleared only after it (TestRouter_SlowEngineIsNotAnIdleClientOverHTTP2
// proves the other direction).
func TestRouter_ClientThatStopsReadingOverHTTP2(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{Tokens: 5_000_000},
		spec:   func(d *structs.Deployment) { d.Limits.ClientReadIdle = structs.Duration(100 * time.Millisecond) },
		h2:     true,
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := e.post(ctx, "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("answered over HTTP/%d, want 2", resp.ProtoMajor)
	}
	first := make([]byte, 64)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	// Never read again: the stream's flow-control window fills, the
	// router's flush blocks, and its client bound must end the stream.
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	waitFor(t, "the outcome", func() bool {
		return strings.Contains(scrape(t, e), `outcome="client_read_idle"} 1`)
	})
	cancel()
	waitFor(t, "idle", e.idle)
}
