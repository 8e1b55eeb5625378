// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// dialFrom opens a raw connection from a loopback address of its own.
func dialFrom(t *testing.T, src, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	return c, bufio.NewReader(c)
}

// served200 sends an authenticated request at once on c and reads a 200.
func served200(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testKey)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("got %d, want 200", resp.StatusCode)
	}
}

// TestLimitListener_EvictIdle: with EvictIdle, a connection over a cap
// closes the oldest one that sent nothing (of its own address for the
// per-address cap, of any for the total) and is served; connections that
// sent part of a request are never closed for it, and a newcomer is then
// refused as without EvictIdle.
func TestLimitListener_EvictIdle(t *testing.T) {
	s := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{MaxConnections: 5, MaxUnauthenticatedPerAddress: 3, EvictIdle: true,
		ReadHeaderTimeout: time.Minute}, TLSFiles{})
	var idle []*bufio.Reader
	for i := 0; i < 3; i++ {
		_, br := dialFrom(t, "127.0.0.2", s.addr)
		idle = append(idle, br)
	}
	poll.Until(t, 10*time.Second, "three idle connections counted", func() bool { return s.ln.Unauthenticated("127.0.0.2") == 3 })
	// The same address at its cap: the newcomer takes the oldest's slot.
	c, br := dialFrom(t, "127.0.0.2", s.addr)
	served200(t, c, br)
	if err := closedByServer(idle[0]); err != nil {
		t.Fatalf("the oldest idle connection: %v", err)
	}
	if n := s.ln.Evicted(); n != 1 {
		t.Fatalf("evicted %d, want 1", n)
	}
	// The total at its cap (2 idle of .2, the served one, and 2 of .3):
	// a newcomer from .4 takes the oldest idle slot of any address.
	for i := 0; i < 2; i++ {
		_, br := dialFrom(t, "127.0.0.3", s.addr)
		idle = append(idle, br)
	}
	poll.Until(t, 10*time.Second, "five connections counted", func() bool { return s.ln.Open() == 5 })
	c4, br4 := dialFrom(t, "127.0.0.4", s.addr)
	served200(t, c4, br4)
	if err := closedByServer(idle[1]); err != nil {
		t.Fatalf("the oldest idle connection of any address: %v", err)
	}
	// Connections that sent a byte are not idle: with only those left
	// over the cap, a newcomer is refused.
	s2 := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{MaxUnauthenticatedPerAddress: 2, EvictIdle: true,
		ReadHeaderTimeout: time.Minute}, TLSFiles{})
	for i := 0; i < 2; i++ {
		c, _ := dialFrom(t, "127.0.0.5", s2.addr)
		_, _ = io.WriteString(c, "GET /v1/mod")
	}
	poll.Until(t, 10*time.Second, "two started connections counted", func() bool { return s2.ln.Unauthenticated("127.0.0.5") == 2 })
	poll.Until(t, 10*time.Second, "a third refused", func() bool {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}).Dial("tcp", s2.addr)
		if err != nil {
			return true
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		return closedByServer(bufio.NewReader(c)) == nil
	})
	if n := s2.ln.Evicted(); n != 0 {
		t.Fatalf("evicted %d connections that had started a request", n)
	}
}
