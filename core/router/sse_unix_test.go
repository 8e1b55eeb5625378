// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestSSEReader_HoldsNoBufferWhileWaiting: over TCP, a reader with nothing
// pending gives its buffer back before it waits for the engine, and reads
// what arrives afterwards.
func TestSSEReader_HoldsNoBufferWhileWaiting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	engineC := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(engineC)
			return
		}
		engineC <- c
	}()
	router, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	engine := <-engineC
	if engine == nil {
		t.Fatal("accept failed")
	}
	defer engine.Close()

	if _, err := engine.Write([]byte(sseHead("Transfer-Encoding: chunked\r\n") + "f\r\ndata: {\"a\":1}\n\n\r\n")); err != nil {
		t.Fatal(err)
	}
	s, _ := readerOver(t, router, 1024)
	if s.raw == nil {
		t.Fatal("a TCP connection is read without RawConn")
	}
	if ev, err := s.next(); err != nil || string(ev) != `data: {"a":1}` {
		t.Fatalf("first event %q, %v", ev, err)
	}
	// Nothing is pending: the wait that a deadline ends holds no buffer.
	s.readWithin(20 * time.Millisecond)
	if n, err := s.readConn(); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("readConn = %d, %v; want a deadline", n, err)
	}
	if s.buf != nil {
		t.Fatalf("the reader holds a %d-byte buffer while it waits", len(s.buf))
	}
	// What arrives next is read into a fresh buffer.
	s.readWithin(time.Minute)
	if _, err := engine.Write([]byte("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	got, err := events(s)
	if len(got) != 1 || got[0] != "data: [DONE]" || err == nil || !s.reusable() {
		t.Fatalf("events %q, %v, reusable %v", got, err, s.reusable())
	}
}
