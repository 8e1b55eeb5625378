// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
)

// TestRouter_FieldNamesAreExact: a field the engine would not see does not
// change what the router does.
func TestRouter_FieldNamesAreExact(t *testing.T) {
	e := newEnv(t, envOpts{})
	resp, err := e.post(context.Background(), "/v1/chat/completions",
		`{"model":"demo","Stream":true,"messages":[{"role":"user","content":"hello"}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("\"Stream\":true was taken for stream: %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// rawPost opens a connection to the env's server and sends a POST's head
// announcing length bytes, then the first bytes of the body, and stops.
func (e *env) rawPost(t *testing.T, length int, first string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", length, first)
	return c, bufio.NewReader(c)
}

// TestRouter_SlowBodyIsNotAllocatedAhead: a client that announces 32 MiB
// and sends 10 bytes gets 408 body_read_timeout and a closed connection,
// and the role never allocated the 32 MiB it announced.
func TestRouter_SlowBodyIsNotAllocatedAhead(t *testing.T) {
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.BodyReadTimeout = 300 * time.Millisecond }})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, br := e.rawPost(t, 32<<20, `{"model":"`)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound for a broken build, not an assertion
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	body := readBody(t, resp)
	runtime.ReadMemStats(&after)
	if resp.StatusCode != http.StatusRequestTimeout || errCode(body) != "body_read_timeout" {
		t.Fatalf("got %d %s, want 408 body_read_timeout", resp.StatusCode, body)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
		t.Fatalf("the role allocated %d bytes for a body of 10 bytes (32 MiB announced)", got)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection stayed open after a body that did not arrive")
	}
	waitFor(t, "the body's bytes given back", func() bool { return e.rt.BodyBytesInFlight() == 0 })
}

// TestRouter_BodiesInFlightBound: past the role's bound on body bytes
// held, a request is refused with 429 bodies_in_flight_full; once the
// bytes are given back it is served.
func TestRouter_BodiesInFlightBound(t *testing.T) {
	e := newEnv(t, envOpts{router: func(c *router.Config) {
		c.MaxBodyBytesInFlight = 24 << 10
		c.BodyReadTimeout = time.Minute
	}})
	// A slow client holds a 16 KiB buffer (its first).
	slow, _ := e.rawPost(t, 20<<10, `{"model":"demo",`)
	waitFor(t, "the slow body's buffer", func() bool { return e.rt.BodyBytesInFlight() > 0 })
	big := chatBody(false, `,"pad":"`+strings.Repeat("x", 12<<10)+`"`)
	resp, err := e.post(context.Background(), "/v1/chat/completions", big, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || errCode(body) != "bodies_in_flight_full" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("got %d %s (Retry-After %q), want 429 bodies_in_flight_full", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	slow.Close()
	waitFor(t, "the slow body's bytes given back", func() bool { return e.rt.BodyBytesInFlight() == 0 })
	resp, err = e.post(context.Background(), "/v1/chat/completions", big, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 {
		t.Fatalf("after the slow client left: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "every body's bytes given back", func() bool { return e.rt.BodyBytesInFlight() == 0 })
}

// TestRouter_SmallBodiesPassAFloodOfLargeOnes: while large bodies hold the
// role's bound, a request of a usual size is still served from the reserve
// only small bodies draw on; another large one is refused.
func TestRouter_SmallBodiesPassAFloodOfLargeOnes(t *testing.T) {
	e := newEnv(t, envOpts{router: func(c *router.Config) {
		c.MaxBodyBytesInFlight = 1 << 20 // a reserve of 64 KiB for bodies up to 64 KiB
		c.MaxBodyBytes = 1 << 20
		c.BodyReadTimeout = time.Minute
	}})
	// A slow client's large body holds the whole bound.
	slow, _ := e.rawPost(t, 1<<20, `{"model":"demo","pad":"`+strings.Repeat("x", 600<<10))
	defer slow.Close()
	waitFor(t, "the large body to hold the bound", func() bool { return e.rt.BodyBytesInFlight() >= 1<<20 })
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 {
		t.Fatalf("a small request during the flood: %d %s", resp.StatusCode, body)
	}
	// A large body is refused from its announced length, before any of it
	// is read: a client that asks with Expect: 100-continue sends nothing
	// more (one that does not may see its connection reset mid-body).
	large := chatBody(false, `,"pad":"`+strings.Repeat("x", 200<<10)+`"`)
	sent := &countingReader{r: strings.NewReader(large)}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/chat/completions", sent)
	req.ContentLength = int64(len(large))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	cl := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	defer cl.CloseIdleConnections()
	resp, err = cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != http.StatusTooManyRequests || errCode(body) != "bodies_in_flight_full" {
		t.Fatalf("another large body during the flood: %d %s", resp.StatusCode, body)
	}
	if n := sent.n.Load(); n != 0 {
		t.Fatalf("the refused body was asked for: the client sent %d bytes of it", n)
	}
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestRouter_BodyOfTheBoundExactly: a body of max_body_bytes exactly is
// served; one byte more is refused 413 request_too_large, announced or
// not (a chunked body is counted as it arrives).
func TestRouter_BodyOfTheBoundExactly(t *testing.T) {
	const max = 4096
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.MaxBodyBytes = max }})
	pad := func(n int) string {
		b := chatBody(false, `,"pad":"`)
		return b[:len(b)-1] + strings.Repeat("x", n-len(b)-1) + `"}`
	}
	cases := []struct {
		name    string
		size    int
		chunked bool
		status  int
	}{
		{"the bound, announced", max, false, 200},
		{"the bound, chunked", max, true, 200},
		{"one byte more, announced", max + 1, false, 413},
		{"one byte more, chunked", max + 1, true, 413},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := pad(c.size)
			if len(body) != c.size {
				t.Fatalf("the test's body has %d bytes, want %d", len(body), c.size)
			}
			var r io.Reader = strings.NewReader(body)
			if c.chunked {
				r = io.MultiReader(r) // no length known: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/chat/completions", r)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got := readBody(t, resp)
			if resp.StatusCode != c.status || (c.status == 413 && errCode(got) != "request_too_large") {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, got, c.status)
			}
		})
	}
}
