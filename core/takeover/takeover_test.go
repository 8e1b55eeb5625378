// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package takeover

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWriteHead(t *testing.T) {
	h := http.Header{"Content-Type": {"text/event-stream"}, "Transfer-Encoding": {"identity"}, "Content-Length": {"9"}}
	var b bytes.Buffer
	WriteHead(&b, http.StatusOK, h, true)
	got := b.String()
	for _, want := range []string{"HTTP/1.1 200 OK\r\n", "Content-Type: text/event-stream\r\n", "Connection: close\r\n", "\r\nDate: ", "Transfer-Encoding: chunked\r\n\r\n"} {
		if !strings.Contains(got, want) {
			t.Fatalf("head %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "identity") || strings.Contains(got, "Content-Length") {
		t.Fatalf("head %q keeps a header of its own framing", got)
	}
	b.Reset()
	WriteHead(&b, http.StatusTooManyRequests, http.Header{"Date": {"then"}}, false)
	if got := b.String(); !strings.HasPrefix(got, "HTTP/1.1 429 Too Many Requests\r\n") || strings.Count(got, "Date:") != 1 || strings.Contains(got, "Connection") {
		t.Fatalf("head %q", got)
	}
}

// pair is a connected loopback TCP pair: what the server took over and
// the client.
func pair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return server, client
}

func TestWriteChunk(t *testing.T) {
	server, client := pair(t)
	go func() {
		_ = WriteChunk(server, []byte(strings.Repeat("a", 300)))
		_ = WriteChunk(server, nil)
		_, _ = server.Write(LastChunk)
		server.Close()
	}()
	all, _ := io.ReadAll(client)
	if want := "12c\r\n" + strings.Repeat("a", 300) + "\r\n0\r\n\r\n"; string(all) != want {
		t.Fatalf("wrote %q", all)
	}
}

func TestWatcher(t *testing.T) {
	if !Supported {
		t.Skip("no watcher on this system")
	}
	cases := []struct {
		name       string
		hangUpOnly bool
		peer       func(net.Conn)
		closeOwn   bool
		hungUp     bool
		bytes      bool
		err        bool
	}{
		{name: "hang-up", peer: func(c net.Conn) { c.Close() }, hungUp: true},
		{name: "the next request, left in the socket", peer: func(c net.Conn) { c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) }, bytes: true},
		{name: "hang-up only: bytes, then a hang-up", hangUpOnly: true, peer: func(c net.Conn) {
			c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
			c.Close()
		}, hungUp: true},
		{name: "closed here", closeOwn: true, err: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server, client := pair(t)
			raw, err := server.(syscall.Conn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				hungUp, bytes bool
				err           error
			}
			done := make(chan result, 1)
			go func() {
				var w Watcher
				h, b, err := w.Wait(raw, c.hangUpOnly)
				done <- result{h, b, err}
			}()
			if c.closeOwn {
				// Before or during the wait: an error either way.
				server.Close()
			} else {
				c.peer(client)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the watcher did not return")
			}
			if r.hungUp != c.hungUp || r.bytes != c.bytes || (r.err != nil) != c.err {
				t.Fatalf("hung up %v, bytes %v, err %v; want %v, %v, err %v", r.hungUp, r.bytes, r.err, c.hungUp, c.bytes, c.err)
			}
			if c.bytes {
				b := make([]byte, 64)
				if n, err := server.Read(b); err != nil || !strings.HasPrefix(string(b[:n]), "GET /") {
					t.Fatalf("the watcher read the client's bytes: %q, %v", b[:n], err)
				}
			}
		})
	}
}

func TestWatchPlain(t *testing.T) {
	server, client := pair(t)
	done := make(chan bool, 1)
	go func() { done <- WatchPlain(server) }()
	client.Write([]byte("pipelined"))
	client.Close()
	if !<-done {
		t.Fatal("a hang-up was not reported")
	}
	server2, _ := pair(t)
	go func() { done <- WatchPlain(server2) }()
	server2.Close() // before or during the read: closed here either way
	if <-done {
		t.Fatal("a connection closed here was reported as a hang-up")
	}
}

// TestHijackAndHandBack takes an answer over, writes it in the chunked
// coding, and hands the connection back: the client reads a complete
// answer and sends its next request on the same connection, which
// net/http serves.
func TestHijackAndHandBack(t *testing.T) {
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/plain" {
			io.WriteString(w, "plain")
			return
		}
		if !Possible(w, r) {
			t.Error("an HTTP/1.1 answer without TLS cannot be taken over")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		c, err := Hijack(w)
		if err != nil {
			t.Error(err)
			return
		}
		var b bytes.Buffer
		WriteHead(&b, http.StatusOK, w.Header(), c.Dropped)
		c.Write(b.Bytes())
		go func() {
			_ = WriteChunk(c, []byte("data: one\n\n"))
			_, _ = c.Write(LastChunk)
			HandBack(srv.Config, c.Conn)
		}()
	})
	srv.Start()
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A broken answer fails the test instead of hanging it.
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	for _, path := range []string{"/stream", "/plain"} {
		req, _ := http.NewRequest(http.MethodGet, "http://x"+path, nil)
		if err := req.Write(conn); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.Close {
			t.Fatalf("%s: %q, %v, closes %v", path, body, err, resp.Close)
		}
		if want := map[string]string{"/stream": "data: one\n\n", "/plain": "plain"}[path]; string(body) != want {
			t.Fatalf("%s answered %q", path, body)
		}
	}
}
