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

// TestSSEReader_LowWaterReadsAtAnIdleBoundBelowTheCheck: with the
// low-water mark and a stream idle bound shorter than lowWaterCheck, every
// wait ends at the bound, not at a look of the clock. Events below the
// mark that arrived meanwhile are read there, on the clock (clocked: an
// engine that left its connection open after its answer is learned from
// it, learnClose) and not counted as a wake-up; with nothing pending the
// bound ends the read (a stalled stream is cut); the engine's close wakes
// the reader. Before, a read at the bound was never clocked, so with such
// a bound an engine that stopped closing its connections was never taken
// off the list.
func TestSSEReader_LowWaterReadsAtAnIdleBoundBelowTheCheck(t *testing.T) {
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

	if _, err := engine.Write([]byte(sseHead("") + "data: {\"a\":1}\n\n")); err != nil {
		t.Fatal(err)
	}
	s, _ := readerOver(t, router, 1024)
	if ev, err := s.next(); err != nil || string(ev) != `data: {"a":1}` {
		t.Fatalf("first event %q, %v", ev, err)
	}
	if !s.lowWater() {
		t.Fatal("no low-water mark on a TCP connection")
	}
	// onWait runs once, when the reader finds nothing pending and is about
	// to wait: what it writes arrives while the reader waits.
	var onWait func()
	inner := s.readFn
	s.readFn = func(fd uintptr) bool {
		ok := inner(fd)
		if f := onWait; !ok && f != nil {
			onWait = nil
			f()
		}
		return ok
	}
	const bound = lowWaterCheck / 4

	s.readWithin(bound)
	onWait = func() {
		if _, err := engine.Write([]byte("data: {\"a\":2}\n\n")); err != nil {
			t.Error(err)
		}
	}
	reads := s.reads
	if n, err := s.readConn(); n == 0 || err != nil {
		t.Fatalf("read at the bound = %d, %v; want the event below the mark", n, err)
	}
	if !s.clocked || s.reads != reads {
		t.Fatalf("an event below the mark read at the bound: clocked %v, wake-ups %d, want clocked and none", s.clocked, s.reads-reads)
	}

	s.readWithin(bound)
	if n, err := s.readConn(); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing pending = %d, %v; want the bound's deadline", n, err)
	}

	s.readWithin(time.Minute)
	onWait = func() {
		if _, err := engine.Write([]byte("data: [DONE]\n\n")); err != nil {
			t.Error(err)
		}
		engine.Close()
	}
	reads = s.reads
	if n, err := s.readConn(); n == 0 || err != nil {
		t.Fatalf("read at the engine's close = %d, %v", n, err)
	}
	if s.clocked || s.reads != reads+1 {
		t.Fatalf("the engine's close: clocked %v, wake-ups %d, want a wake-up", s.clocked, s.reads-reads)
	}
}

// deadlineConn counts the read deadlines set on a TCP connection (its
// RawConn stays reachable: the reader waits on it as on any TCP one).
type deadlineConn struct {
	*net.TCPConn
	reads int
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.reads++
	return c.TCPConn.SetReadDeadline(t)
}

// tcpPair is a connected router and engine end over loopback TCP.
func tcpPair(t *testing.T) (router *net.TCPConn, engine net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	engineC := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		engineC <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	engine = <-engineC
	if engine == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { engine.Close() })
	return c.(*net.TCPConn), engine
}

// TestSSEReader_StreamIdleBoundMovesOncePerSixteenth: the relay asks for
// the stream idle bound at every read, but the connection's deadline moves
// once per sixteenth of the bound, not once per read (each move is a
// timer change in the runtime).
func TestSSEReader_StreamIdleBoundMovesOncePerSixteenth(t *testing.T) {
	router, engine := tcpPair(t)
	if _, err := engine.Write([]byte(sseHead("Transfer-Encoding: chunked\r\n"))); err != nil {
		t.Fatal(err)
	}
	dc := &deadlineConn{TCPConn: router}
	s, _ := readerOver(t, dc, 1024)
	if s.raw == nil {
		t.Fatal("the counting connection is read without RawConn")
	}
	for i := 0; i < 100; i++ {
		s.readWithin(time.Hour)
	}
	if dc.reads != 1 {
		t.Fatalf("100 bounds asked within a second moved the deadline %d times, want 1", dc.reads)
	}
	s.readWithin(time.Second) // a shorter bound moves it at once
	if dc.reads != 2 || !s.armed.Equal(s.want) {
		t.Fatalf("a shorter bound: %d moves, armed %v, want %v", dc.reads, s.armed, s.want)
	}
}

// TestSSEReader_EarlyDeadlineWaitsOnToTheBound: a read that meets the
// connection's deadline before the bound readWithin asked for last waits on
// until that bound: the stream idle bound holds from the last output,
// never less.
func TestSSEReader_EarlyDeadlineWaitsOnToTheBound(t *testing.T) {
	router, engine := tcpPair(t)
	if _, err := engine.Write([]byte(sseHead("Transfer-Encoding: chunked\r\n"))); err != nil {
		t.Fatal(err)
	}
	s, _ := readerOver(t, router, 1024)
	s.readWithin(200 * time.Millisecond)
	// As a later readWithin within the sixteenth leaves it: the connection's
	// deadline is 100 ms before the bound.
	s.want = s.armed.Add(100 * time.Millisecond)
	n, err := s.readConn()
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("readConn = %d, %v; want a deadline", n, err)
	}
	if !s.armed.Equal(s.want) {
		t.Fatalf("the early deadline was not moved to the bound: armed %v, want %v", s.armed, s.want)
	}
	// Bytes within the bound are read as ever.
	s.readWithin(time.Second)
	s.want = s.armed.Add(time.Second)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = engine.Write([]byte("f\r\ndata: {\"a\":1}\n\n\r\n"))
	}()
	if ev, err := s.next(); err != nil || string(ev) != `data: {"a":1}` {
		t.Fatalf("next = %q, %v", ev, err)
	}
}
