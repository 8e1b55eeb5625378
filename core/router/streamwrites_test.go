// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// writesConn records what each Write of a connection carried.
type writesConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (c *writesConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes = append(c.writes, append([]byte(nil), p...))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *writesConn) all() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.writes...)
}

// writesListener hands out writesConns.
type writesListener struct {
	net.Listener
	conns chan *writesConn
}

func (l *writesListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	wc := &writesConn{Conn: c}
	l.conns <- wc
	return wc, nil
}

// wholeEngine answers every request with a stream written in parts: each
// part one write, the last one with the chunked coding's end.
func wholeEngine(t *testing.T, parts ...string) string {
	return partsEngine(t, 5*time.Millisecond, parts...)
}

// partsEngine is wholeEngine with the pause between parts; a single part
// goes in one write with the answer's head: the whole answer is in the
// router's socket at once.
func partsEngine(t *testing.T, pause time.Duration, parts ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				w := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
				if len(parts) > 1 {
					_, _ = io.WriteString(c, w)
					w = ""
				}
				for i, p := range parts {
					w += strconv.FormatInt(int64(len(p)), 16) + "\r\n" + p + "\r\n"
					if i == len(parts)-1 {
						w += "0\r\n\r\n"
					}
					_, _ = io.WriteString(c, w)
					w = ""
					time.Sleep(pause) // each part read on its own
				}
				_, _ = io.Copy(io.Discard, br) // until the router closes or reuses it
			}(c)
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestRouter_StreamEndLeavesInOneWrite: where the engine's body ended with
// its last event, the answer's end ([DONE], then the chunked coding's end)
// leaves in one write, not a flush of [DONE] and then net/http's last
// chunk. Every event still arrives, the metrics comment and [DONE] last.
func TestRouter_StreamEndLeavesInOneWrite(t *testing.T) {
	url := wholeEngine(t, roleChunk+contentChunk, finishChunk)
	e := newEnv(t, envOpts{
		ep:     func(ep *structs.EngineEndpoint) { ep.BaseURL = url },
		router: func(c *router.Config) { c.TakeOverAfter = time.Hour },
	})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &writesListener{Listener: inner, conns: make(chan *writesConn, 1)}
	srv := &http.Server{Handler: e.srv.Config.Handler}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	resp, err := http.Post("http://"+inner.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(true, "")))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	data, comments := sseLines(body)
	if len(data) != 4 || data[3] != "[DONE]" || len(comments) == 0 {
		t.Fatalf("the stream: %q", body)
	}
	wc := <-ln.conns
	writes := wc.all()
	last := writes[len(writes)-1]
	if !bytes.Contains(last, []byte("data: [DONE]\n\n")) || !bytes.HasSuffix(last, []byte("0\r\n\r\n")) {
		var b strings.Builder
		for i, w := range writes {
			fmt.Fprintf(&b, "\nwrite %d: %q", i, w)
		}
		t.Fatalf("the answer's end left in more than one write:%s", b.String())
	}
}

// TestRouter_AnswerInTheSocketLeavesInOneWrite: an engine that wrote its
// whole answer at once (head and 2.5 KiB of events) has it read with its
// head, and the client gets it in one write: the relay flushes once per
// read from the engine, and the read that brings the head brings as much
// as the relay's own reads would.
func TestRouter_AnswerInTheSocketLeavesInOneWrite(t *testing.T) {
	// More than the 2 KiB a head's reader used to hold, less than the
	// 4 KiB net/http writes at a time.
	answer := roleChunk + strings.Repeat(contentChunk, 26) + finishChunk
	if len(answer) < 2300 || len(answer) > 3000 {
		t.Fatalf("the answer is %d bytes, want 2300 to 3000", len(answer))
	}
	url := partsEngine(t, 0, answer)
	e := newEnv(t, envOpts{
		ep:     func(ep *structs.EngineEndpoint) { ep.BaseURL = url },
		router: func(c *router.Config) { c.TakeOverAfter = time.Hour },
	})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &writesListener{Listener: inner, conns: make(chan *writesConn, 1)}
	srv := &http.Server{Handler: e.srv.Config.Handler}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	resp, err := http.Post("http://"+inner.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(true, "")))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	data, _ := sseLines(body)
	if len(data) != 29 || data[28] != "[DONE]" {
		t.Fatalf("the stream has %d events, want 29 ending with [DONE]", len(data))
	}
	wc := <-ln.conns
	if writes := wc.all(); len(writes) != 1 {
		var b strings.Builder
		for i, w := range writes {
			fmt.Fprintf(&b, "\nwrite %d: %d bytes", i, len(w))
		}
		t.Fatalf("the answer left in %d writes, want 1:%s", len(writes), b.String())
	}
}

// TestRouter_TakenOverHeadLeavesWithItsEvents: a stream taken over at its
// first flush (its head still the router's to write) sends the head and
// the events read so far in one write, also on a connection that offers
// no writev (a listener's wrapper, as core/api's).
func TestRouter_TakenOverHeadLeavesWithItsEvents(t *testing.T) {
	url := wholeEngine(t, roleChunk+contentChunk, contentChunk, finishChunk)
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.BaseURL = url }})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &writesListener{Listener: inner, conns: make(chan *writesConn, 1)}
	srv := &http.Server{Handler: e.srv.Config.Handler}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	resp, err := http.Post("http://"+inner.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(true, "")))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if data, _ := sseLines(body); len(data) != 5 || data[4] != "[DONE]" {
		t.Fatalf("the stream: %q", body)
	}
	wc := <-ln.conns
	writes := wc.all()
	if len(writes) == 0 || !bytes.HasPrefix(writes[0], []byte("HTTP/1.1 200 OK\r\n")) || !bytes.Contains(writes[0], []byte("data: ")) {
		var b strings.Builder
		for i, w := range writes {
			fmt.Fprintf(&b, "\nwrite %d: %q", i, w)
		}
		t.Fatalf("the head left without the events read with it:%s", b.String())
	}
}
