// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
)

// TestRouter_RewrittenBodyOverTheBound: a body rewritten for the engine (the
// served name differs from the route) is a new copy, counted against
// limits.max_body_bytes_in_flight for what it holds beyond the client's
// buffer until the engine has it. When the copy would take the role past
// its bound (the client's buffer fitted, the copy does not), the request is
// refused with 429 bodies_in_flight_full and gives back its place and its
// bytes: the same request is served once there is room.
func TestRouter_RewrittenBodyOverTheBound(t *testing.T) {
	rewrittenBody(t, 0, http.StatusTooManyRequests)
}

// TestRouter_RewrittenBodyFitsBesideOthers: the copy is counted for what it
// adds to the client's buffer, not for the two of them: with room for the
// client's body and a few KiB more, the rewritten request is served.
func TestRouter_RewrittenBodyFitsBesideOthers(t *testing.T) {
	rewrittenBody(t, 4<<10, http.StatusOK)
}

// rewrittenBody sends a rewritten body of about 2 MiB while a slow client
// holds all of the role's bound but the body's length and spare bytes, and
// wants the status want; then, the slow client gone, the body is served.
func rewrittenBody(t *testing.T, spare, want int) {
	t.Helper()
	const bound = 8 << 20 // the reserve for small bodies is 512 KiB
	e := newEnv(t, envOpts{router: func(c *router.Config) {
		c.MaxBodyBytesInFlight = bound
		c.MaxBodyBytes = 8 << 20
		c.BodyReadTimeout = time.Minute
	}})
	// A slow client holds a buffer that leaves room for one more body
	// exactly as long as the next one, and not for its rewritten copy.
	const pad = 2 << 20
	body := chatBody(false, `,"pad":"`+strings.Repeat("x", pad)+`"`)
	n := len(body)
	slowLen := bound - n - spare
	// The slow body grows its buffer by doubling up to its announced
	// length: send all of it but its last byte.
	slow, _ := e.rawPost(t, slowLen, `{"model":"demo","pad":"`+strings.Repeat("x", slowLen-len(`{"model":"demo","pad":"`)-3))
	defer slow.Close()
	waitFor(t, "the slow body's buffer at its full length", func() bool { return e.rt.BodyBytesInFlight() == int64(slowLen) })
	resp, err := e.post(context.Background(), "/v1/chat/completions", body, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := readBody(t, resp)
	switch want {
	case http.StatusTooManyRequests:
		if resp.StatusCode != want || errCode(got) != "bodies_in_flight_full" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("got %d %.200s (Retry-After %q), want 429 bodies_in_flight_full for the rewritten copy", resp.StatusCode, got, resp.Header.Get("Retry-After"))
		}
	default:
		if resp.StatusCode != want {
			t.Fatalf("got %d %.200s with %d bytes to spare beside the body, want %d", resp.StatusCode, got, spare, want)
		}
	}
	waitFor(t, "the request's bytes given back", func() bool { return e.rt.BodyBytesInFlight() == int64(slowLen) })
	slow.Close()
	waitFor(t, "the slow body's bytes given back", func() bool { return e.rt.BodyBytesInFlight() == 0 })
	resp, err = e.post(context.Background(), "/v1/chat/completions", body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the slow client left: %d %.200s (the refused request kept its place or bytes)", resp.StatusCode, got)
	}
	waitFor(t, "every body's bytes given back", func() bool { return e.rt.BodyBytesInFlight() == 0 })
}
