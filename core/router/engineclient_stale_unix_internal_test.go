// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// The two defences against an engine that closes keep-alive connections on
// its own (llama-server after every stream), each pinned by a test that
// fails every run when it is removed; TestRouter_EngineClosesAfterEveryStream
// shows both together under load, where either alone mostly suffices.

// rawEngine is an HTTP/1.1 engine on loopback written by hand, so that a
// test decides what becomes of each connection after each answer. handle
// runs once per accepted connection, numbered from 0.
type rawEngine struct {
	addr  string
	conns atomic.Int32
	wg    sync.WaitGroup
}

func startRawEngine(t *testing.T, handle func(n int, c net.Conn, br *bufio.Reader)) *rawEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &rawEngine{addr: ln.Addr().String()}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(e.conns.Add(1)) - 1
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				handle(n, c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); e.wg.Wait() })
	return e
}

// answerOne reads one request and answers it with keep-alive; false when
// no whole request came.
func answerOne(c net.Conn, br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, req.Body)
	const body = `{"ok":true}`
	_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\nContent-Length: 11\r\n\r\n"+body)
	return err == nil
}

// peerClosed reports whether the engine's end of c sent its FIN: a peek
// reads the end of the stream. The test's own reading, independent of alive.
func peerClosed(c net.Conn) bool {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil
	})
	return closed
}

// send does one request on cl and reads its answer to the end.
func send(t *testing.T, cl *engineClient, addr string) error {
	t.Helper()
	call, err := cl.do(context.Background(), engineTarget{addr: addr, path: "/v1/chat/completions"}, nil, []byte(`{}`), time.Now().Add(30*time.Second), &cutter{})
	if err != nil {
		return err
	}
	b, err := io.ReadAll(call.Resp.Body)
	call.finish(err == nil)
	if err != nil || call.Resp.StatusCode != http.StatusOK || string(b) != `{"ok":true}` {
		t.Fatalf("answer %d %q %v", call.Resp.StatusCode, b, err)
	}
	return nil
}

// TestEngineClient_NeverWritesOnConnectionEngineClosed: a pooled connection
// whose engine end is closed (FIN received) is dropped before use, not
// written to and then sent again. The engine here only half-closes, so it
// sees whatever would be written after its FIN: a real engine that closed
// fully would have the kernel answer with a reset, and a request written
// there is a request the engine may or may not have begun.
func TestEngineClient_NeverWritesOnConnectionEngineClosed(t *testing.T) {
	var late atomic.Int32
	firstDone := make(chan struct{})
	e := startRawEngine(t, func(n int, c net.Conn, br *bufio.Reader) {
		if n > 0 {
			for answerOne(c, br) {
			}
			return
		}
		defer close(firstDone)
		if !answerOne(c, br) {
			return
		}
		_ = c.(*net.TCPConn).CloseWrite()
		if _, err := http.ReadRequest(br); err == nil {
			late.Add(1) // a request on a connection this engine had closed
		}
	})
	cl := newEngineClient(4)
	t.Cleanup(cl.closeIdle)

	if err := send(t, cl, e.addr); err != nil {
		t.Fatal(err)
	}
	cl.mu.Lock()
	pooled := append([]net.Conn(nil), cl.idle[e.addr]...)
	cl.mu.Unlock()
	if len(pooled) != 1 {
		t.Fatalf("%d pooled connections after one answer, want 1", len(pooled))
	}
	poll.Until(t, 10*time.Second, "the engine's FIN on the pooled connection", func() bool { return peerClosed(pooled[0]) })

	if err := send(t, cl, e.addr); err != nil {
		t.Fatalf("second request: %v", err)
	}
	select {
	case <-firstDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the first connection was never closed by the client")
	}
	if n := late.Load(); n != 0 {
		t.Fatalf("a request was written on the connection the engine had closed")
	}
	if n := e.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the closed one replaced once)", n)
	}
	if n := cl.stale.Load(); n != 1 {
		t.Fatalf("stale = %d, want 1", n)
	}
}

// TestEngineClient_ResendsOnceWhenEngineClosesUnderRequest: an engine that
// closes a kept connection as the next request arrives, before reading it
// (the race no check before use can see), costs the request nothing: it is
// sent again once on a new connection.
func TestEngineClient_ResendsOnceWhenEngineClosesUnderRequest(t *testing.T) {
	e := startRawEngine(t, func(n int, c net.Conn, br *bufio.Reader) {
		if !answerOne(c, br) {
			return
		}
		if n == 0 {
			// Wait for the next request's first byte, then close unread:
			// the kernel resets the connection, as a closing engine does.
			_, _ = br.Peek(1)
			return
		}
		for answerOne(c, br) {
		}
	})
	cl := newEngineClient(4)
	t.Cleanup(cl.closeIdle)
	for i := 0; i < 2; i++ {
		if err := send(t, cl, e.addr); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := e.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the request sent again once)", n)
	}
	if n := cl.stale.Load(); n != 1 {
		t.Fatalf("stale = %d, want 1", n)
	}
}

// TestEngineClient_ResendsWhenWriteFailsOnReusedConnection: an engine that
// closes a kept connection while a large request is being written to it
// (the write itself fails: the engine's kernel resets the connection
// holding unread bytes) costs the request nothing either: it never reached
// the engine's handler and is sent again once on a new connection.
func TestEngineClient_ResendsWhenWriteFailsOnReusedConnection(t *testing.T) {
	e := startRawEngine(t, func(n int, c net.Conn, br *bufio.Reader) {
		if !answerOne(c, br) {
			return
		}
		if n == 0 {
			_, _ = br.Peek(1) // the next request began: close unread
			return
		}
		for answerOne(c, br) {
		}
	})
	cl := newEngineClient(4)
	t.Cleanup(cl.closeIdle)
	if err := send(t, cl, e.addr); err != nil {
		t.Fatal(err)
	}
	// Larger than what the kernel buffers on both ends of a loopback
	// connection: its write is under way when the reset comes.
	big := make([]byte, 64<<20)
	call, err := cl.do(context.Background(), engineTarget{addr: e.addr, path: "/v1/chat/completions"}, nil, big, time.Now().Add(30*time.Second), &cutter{})
	if err != nil {
		t.Fatalf("the large request: %v", err)
	}
	b, err := io.ReadAll(call.Resp.Body)
	call.finish(err == nil)
	if err != nil || string(b) != `{"ok":true}` {
		t.Fatalf("answer %q %v", b, err)
	}
	if n := e.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the request sent again once)", n)
	}
	if n := cl.stale.Load(); n != 1 {
		t.Fatalf("stale = %d, want 1", n)
	}
}
