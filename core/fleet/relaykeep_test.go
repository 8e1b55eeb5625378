// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package fleet

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// keepServer serves relayed streams: each request gets a host answer whose
// parts arrive on the channel its handler is given, through relayStream,
// as relayBody relays a stream. It counts the client connections it
// clients dial (client), and the relayed streams cancelled.
type keepServer struct {
	url       string
	conns     atomic.Int32 // connections its clients dialed
	cancelled atomic.Int32
	bodies    chan *burstBody // each request's host answer, as it starts
	returned  chan struct{}   // a value each time a handler returns
}

func startKeepServer(t *testing.T) *keepServer {
	t.Helper()
	ks := &keepServer{bodies: make(chan *burstBody, 4), returned: make(chan struct{}, 4)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() { ks.returned <- struct{}{} }()
			body := &burstBody{ch: make(chan []byte), waiting: make(chan struct{}, 64)}
			ks.bodies <- body
			resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body}
			ctx, cancel := context.WithCancel(context.Background())
			rl := hostReply{resp: resp, ctx: ctx, host: "gpu-1", cancel: func() {
				if ctx.Err() == nil {
					ks.cancelled.Add(1)
				}
				cancel()
				// A cancelled host answer ends its reads, as the relay's
				// HTTP/2 stream does.
				defer func() { _ = recover() }()
				close(body.ch)
			}}
			var u undo
			defer u.run()
			relayStream(w, r, rl, &u)
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	ks.url = "http://" + ln.Addr().String()
	return ks
}

// client is an HTTP client with keep-alive connections that ks counts.
func (ks *keepServer) client() *http.Client {
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		ks.conns.Add(1)
		return d.DialContext(ctx, network, addr)
	}}}
}

// body is the next request's host answer.
func (ks *keepServer) body(t *testing.T) *burstBody {
	t.Helper()
	select {
	case b := <-ks.bodies:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached the server")
		return nil
	}
}

// send hands part to the relay reading body.
func (ks *keepServer) send(t *testing.T, body *burstBody, part string) {
	t.Helper()
	select {
	case body.ch <- []byte(part):
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not read the host's answer")
	}
}

// stream sends one streamed request on client and relays parts as the
// host's answer; it returns what the client read.
func (ks *keepServer) stream(t *testing.T, client *http.Client, parts ...string) string {
	t.Helper()
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Post(ks.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
		if err != nil {
			done <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{string(b), err}
	}()
	body := ks.body(t)
	for _, p := range parts {
		ks.send(t, body, p)
	}
	close(body.ch)
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("the stream: %v", r.err)
		}
		return r.body
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
		return ""
	}
}

var keepParts = []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "data: [DONE]\n\n"}

// setTakeOverAfter sets takeOverAfter for one test and restores it in a
// cleanup registered before the test's servers, so that it runs after they
// stopped (cleanups run last first): a deferred restore ran while their
// taken-over streams could still read it.
func setTakeOverAfter(t *testing.T, d time.Duration) {
	t.Helper()
	old := takeOverAfter
	takeOverAfter = d
	t.Cleanup(func() { takeOverAfter = old })
}

// TestRelay_AShortStreamKeepsItsConnection: a stream that ends before the
// take-over stays on net/http, and the client's keep-alive connection
// carries its next request. Before, every relayed stream was taken over at
// its head and its connection closed after it: a new connection per
// stream.
func TestRelay_AShortStreamKeepsItsConnection(t *testing.T) {
	setTakeOverAfter(t, time.Hour)
	ks := startKeepServer(t)
	client := ks.client()
	for i := 0; i < 3; i++ {
		if got := ks.stream(t, client, keepParts...); got != strings.Join(keepParts, "") {
			t.Fatalf("stream %d read %q", i, got)
		}
	}
	if n := ks.conns.Load(); n != 1 {
		t.Fatalf("3 streams took %d connections, want 1", n)
	}
}

// TestRelay_ALongStreamIsTakenOverAndItsConnectionComesBack: a stream that
// runs past the take-over leaves net/http (its handler returns while the
// stream goes on), ends whole, and its connection goes back to net/http
// for the client's next request, again and again: a connection handed
// back is taken over as the first was (it went back as the bare
// connection, not the take-over's wrapper, which offers no socket to
// watch: the second stream's connection closed after a whole answer, and
// the client's next request on it was reset).
func TestRelay_ALongStreamIsTakenOverAndItsConnectionComesBack(t *testing.T) {
	setTakeOverAfter(t, 0)
	ks := startKeepServer(t)
	client := ks.client()
	for i := 0; i < 3; i++ {
		type result struct {
			body string
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := client.Post(ks.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
			if err != nil {
				done <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			done <- result{string(b), err}
		}()
		body := ks.body(t)
		ks.send(t, body, keepParts[0])
		select {
		case <-ks.returned: // taken over at the first flush: the handler returned mid-stream
		case <-time.After(10 * time.Second):
			t.Fatal("the stream was not taken over")
		}
		ks.send(t, body, keepParts[1])
		close(body.ch)
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d did not end", i)
		}
		if r.err != nil || r.body != strings.Join(keepParts, "") {
			t.Fatalf("stream %d: read %q (%v)", i, r.body, r.err)
		}
	}
	if n := ks.conns.Load(); n != 1 {
		t.Fatalf("3 taken-over streams took %d connections, want 1 (handed back)", n)
	}
	if n := ks.cancelled.Load(); n != 0 {
		t.Fatalf("%d whole streams were cancelled", n)
	}
}

// TestRelay_AHangUpCutsATakenOverStream: a client that hangs up in the
// middle of a taken-over stream cancels it (the host then cancels the
// engine's work).
func TestRelay_AHangUpCutsATakenOverStream(t *testing.T) {
	setTakeOverAfter(t, 0)
	ks := startKeepServer(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(ks.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	body := ks.body(t)
	ks.send(t, body, keepParts[0])
	select {
	case <-ks.returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream was not taken over")
	}
	_ = conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for ks.cancelled.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the hang-up did not cancel the taken-over stream")
		}
		time.Sleep(time.Millisecond)
	}
}
