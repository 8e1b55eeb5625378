// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

const testKey = "capy-test-key"

// inferenceAuth is the inference API's authentication with one key, the
// role's, and no bound on failed authentications (these tests fail many
// from one address on purpose).
func inferenceAuth(next http.Handler, key string) http.Handler {
	return InferenceAuth(next, apikeys.RoleOnly(key), AuthOptions{FailuresPerMinute: -1})
}

// served is a test server on a LimitListener.
type served struct {
	addr string
	ln   *LimitListener
}

// serveTest serves h on loopback with o until the test ends; tls files
// when set.
func serveTest(t *testing.T, h http.Handler, o ListenerOptions, f TLSFiles) *served {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := NewLimitListener(ln, o)
	var inner net.Listener = lim
	if f.Enabled() {
		if inner, err = TLSListener(lim, f, nil); err != nil {
			t.Fatal(err)
		}
	}
	srv := NewServer(h, o)
	done := make(chan struct{})
	go func() { _ = srv.Serve(inner); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return &served{addr: ln.Addr().String(), ln: lim}
}

// okHandler reads the body and answers 200 "ok".
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	_, _ = io.WriteString(w, "ok")
})

// dial opens a raw connection; a read that waits longer than a minute
// fails (a bound for a broken build, not an assertion).
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	return c, bufio.NewReader(c)
}

// closedByServer reports whether the server closed the connection: the
// next read ends with EOF or a reset, not a timeout.
func closedByServer(br *bufio.Reader) error {
	_, err := br.ReadByte()
	var ne net.Error
	switch {
	case err == nil:
		return errors.New("the server sent more bytes")
	case errors.As(err, &ne) && ne.Timeout():
		return errors.New("the connection is still open")
	}
	return nil
}

// refused reports whether a new connection is closed by the server: reset
// while it connects, or closed before any answer.
func refused(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil // reset during the connect
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	return closedByServer(bufio.NewReader(c))
}

func TestInferenceAuth_ClosesUnauthenticatedConnections(t *testing.T) {
	cases := []struct {
		name    string
		handler http.Handler
		request string
	}{
		{"inference, no body", inferenceAuth(okHandler, testKey), "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"inference, wrong key", inferenceAuth(okHandler, testKey), "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n"},
		// One byte of a 1000-byte body, then nothing: the answer may not wait
		// for the rest.
		{"inference, dripping body", inferenceAuth(okHandler, testKey), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"},
		{"inference, dripping chunked body", inferenceAuth(okHandler, testKey), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"},
		{"management, no body", managementAuth(okHandler, testKey, nil), "GET /management/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"management, dripping body", managementAuth(okHandler, testKey, nil), "POST /management/v1/deployments HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := serveTest(t, c.handler, ListenerOptions{}, TLSFiles{})
			conn, br := dial(t, s.addr)
			if _, err := io.WriteString(conn, c.request); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
				t.Fatalf("got %d (close %v), want 401 and Connection: close", resp.StatusCode, resp.Close)
			}
			if err := closedByServer(br); err != nil {
				t.Fatal(err)
			}
			poll.Until(t, 10*time.Second, "the connection's slot freed", func() bool { return s.ln.Open() == 0 })
		})
	}
}

func TestServer_ClosesIdleConnections(t *testing.T) {
	s := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{IdleTimeout: 100 * time.Millisecond}, TLSFiles{})
	conn, br := dial(t, s.addr)
	fmt.Fprintf(conn, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testKey)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("got %d (close %v), want a kept-alive 200", resp.StatusCode, resp.Close)
	}
	// The client sends nothing more: the server closes the connection.
	if err := closedByServer(br); err != nil {
		t.Fatal(err)
	}
}

// TestBodyDeadline_Management: an authenticated body that does not arrive
// is answered 408 body_read_timeout and its connection closed.
func TestBodyDeadline_Management(t *testing.T) {
	h := BodyDeadline(managementAuth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBody(r); err != nil {
			writeMgmtError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}), testKey, nil), 200*time.Millisecond)
	s := serveTest(t, h, ListenerOptions{}, TLSFiles{})
	conn, br := dial(t, s.addr)
	fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{", testKey)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "body_read_timeout") {
		t.Fatalf("got %d %s, want 408 body_read_timeout", resp.StatusCode, body)
	}
	if err := closedByServer(br); err != nil {
		t.Fatal(err)
	}
	// A body that arrives whole leaves no deadline behind: the connection
	// serves a long request after it.
	conn, br = dial(t, s.addr)
	fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 2\r\n\r\n{}", testKey)
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("whole body: %v %v", resp, err)
	}
}

// TestLimitListener_Cap: past max_connections a connection is closed at
// once; the held ones are dropped by the header deadline and a client is
// served again.
func TestLimitListener_Cap(t *testing.T) {
	const max = 4
	s := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{MaxConnections: max, ReadHeaderTimeout: 3 * time.Second}, TLSFiles{})
	var held []*bufio.Reader
	for i := 0; i < max; i++ {
		_, br := dial(t, s.addr)
		held = append(held, br)
	}
	poll.Until(t, 10*time.Second, "the idle connections counted", func() bool { return s.ln.Open() == max })
	for i := 0; i < 2; i++ {
		if err := refused(s.addr); err != nil {
			t.Fatalf("connection %d over the cap: %v", max+i+1, err)
		}
	}
	if n := s.ln.Refused(); n != 2 {
		t.Fatalf("refused %d connections, want 2", n)
	}
	// The idle connections are dropped by the header deadline...
	for i, br := range held {
		if err := closedByServer(br); err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
	}
	// ...and a client is served again.
	poll.Until(t, 10*time.Second, "a request served after the idle connections left", func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.addr+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// TestLimitListener_UnauthenticatedPerAddress: an address holds at most N
// connections that carried no authenticated request; an authenticated one
// no longer counts.
func TestLimitListener_UnauthenticatedPerAddress(t *testing.T) {
	s := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{MaxUnauthenticatedPerAddress: 2}, TLSFiles{})
	c1, br1 := dial(t, s.addr)
	_, _ = dial(t, s.addr)
	poll.Until(t, 10*time.Second, "two unauthenticated connections counted", func() bool { return s.ln.Unauthenticated("127.0.0.1") == 2 })
	if err := refused(s.addr); err != nil {
		t.Fatalf("a third unauthenticated connection: %v", err)
	}
	if n := s.ln.Refused(); n != 1 {
		t.Fatalf("refused %d connections, want 1", n)
	}
	// The first connection authenticates: a new one is accepted.
	fmt.Fprintf(c1, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testKey)
	resp, err := http.ReadResponse(br1, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("authenticated request: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if n := s.ln.Unauthenticated("127.0.0.1"); n != 1 {
		t.Fatalf("%d unauthenticated connections after one authenticated, want 1", n)
	}
	c3, br3 := dial(t, s.addr)
	fmt.Fprintf(c3, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testKey)
	if resp, err := http.ReadResponse(br3, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a new connection after one authenticated: %v %v", resp, err)
	}
}

// TestLimitListener_KeepsTheRawSocket: the router's streams wait on the raw
// socket of a connection taken over from net/http; the wrapper passes it
// on.
func TestLimitListener_KeepsTheRawSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := NewLimitListener(ln, ListenerOptions{})
	defer lim.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := lim.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatal("the counted connection hides its syscall.Conn")
	}
	if raw, err := sc.SyscallConn(); err != nil || raw == nil {
		t.Fatalf("SyscallConn: %v", err)
	}
}
