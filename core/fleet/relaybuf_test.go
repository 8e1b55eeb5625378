// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/takeover"
)

// burstBody is a host's answer as the relay reads it: each Read returns
// what has arrived (up to the buffer), and waits when nothing has.
type burstBody struct {
	ch      chan []byte
	waiting chan struct{} // a value each time a Read finds nothing
	pending []byte
}

func (b *burstBody) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		b.waiting <- struct{}{}
		d, ok := <-b.ch
		if !ok {
			return 0, io.EOF
		}
		b.pending = d
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *burstBody) Close() error { return nil }

// TestRelayTaken_BurstsLeaveInFewWrites: the chunks of a fast engine
// arrive together and leave the server in a few writes (a small read, then
// a large one), and every read's bytes are written before the next read
// waits.
func TestRelayTaken_BurstsLeaveInFewWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	body := &burstBody{ch: make(chan []byte), waiting: make(chan struct{}, 1)}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body}
	ended := make(chan struct{})
	var u undo
	u.push(func() { close(ended) })
	var head bytes.Buffer
	takeover.WriteHead(&head, resp.StatusCode, resp.Header, true)
	rl := hostReply{resp: resp, cancel: func() {}, ctx: context.Background(), host: "h"}
	go relayTaken(&takeover.Conn{Conn: server}, head.Bytes(), rl, "/v1/chat/completions", &u, nil)

	br := bufio.NewReader(client)
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := http.ReadResponse(br, nil); err != nil {
		t.Fatal(err)
	}
	waitRead := func() {
		t.Helper()
		select {
		case <-body.waiting:
		case <-time.After(10 * time.Second):
			t.Fatal("the relay did not read")
		}
	}
	// readChunks reads chunks until n bytes of data arrived, and returns
	// how many chunks carried them.
	readChunks := func(n int) int {
		t.Helper()
		chunks := 0
		for got := 0; got < n; chunks++ {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("chunk size: %v (after %d of %d bytes)", err, got, n)
			}
			var size int
			if _, err := fmt.Sscanf(strings.TrimSpace(line), "%x", &size); err != nil || size == 0 {
				t.Fatalf("chunk size line %q", line)
			}
			if _, err := io.CopyN(io.Discard, br, int64(size)+2); err != nil {
				t.Fatal(err)
			}
			got += size
		}
		return chunks
	}
	waitRead()
	burst := []byte(strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 800)) // 40 KB
	body.ch <- burst
	waitRead() // the relay waits for more: the burst must have left
	if chunks := readChunks(len(burst)); chunks > 3 {
		t.Fatalf("a burst of %d bytes left in %d writes, want at most 3 (a small read, then large ones)", len(burst), chunks)
	}
	body.ch <- []byte("data: [DONE]\n\n")
	waitRead()
	if chunks := readChunks(len("data: [DONE]\n\n")); chunks != 1 {
		t.Fatalf("the last event left in %d writes", chunks)
	}
	close(body.ch)
	<-ended
	if line, _ := br.ReadString('\n'); line != "0\r\n" {
		t.Fatalf("the answer's end: %q", line)
	}
}

// writeCounter is a connection wrapped as a listener wraps its own (core/api's
// tracked connection): no writev; it counts the writes made on it.
type writeCounter struct {
	net.Conn
	writes atomic.Int32
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(p)
}

// TestRelayTaken_AChunkLeavesInOneWrite: on a connection the listener
// wrapped, each read's chunk leaves in one write, its framing with it (it
// left in three: the size line, the bytes, the line end), and the
// answer's end in one more.
func TestRelayTaken_AChunkLeavesInOneWrite(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	wc := &writeCounter{Conn: server}
	body := &burstBody{ch: make(chan []byte), waiting: make(chan struct{}, 1)}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body}
	ended := make(chan struct{})
	var u undo
	u.push(func() { close(ended) })
	rl := hostReply{resp: resp, cancel: func() {}, ctx: context.Background(), host: "h"}
	go relayTaken(&takeover.Conn{Conn: wc}, nil, rl, "/v1/chat/completions", &u, nil)
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(client)
		read <- string(b)
	}()
	const event = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	for i := 0; i < 3; i++ {
		select {
		case <-body.waiting:
		case <-time.After(10 * time.Second):
			t.Fatal("the relay did not read")
		}
		body.ch <- []byte(event)
	}
	<-body.waiting
	close(body.ch)
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end")
	}
	got := <-read
	chunk := fmt.Sprintf("%x\r\n%s\r\n", len(event), event)
	if want := strings.Repeat(chunk, 3) + "0\r\n\r\n"; got != want {
		t.Fatalf("the client read %q, want %q", got, want)
	}
	if n := wc.writes.Load(); n != 4 {
		t.Fatalf("3 chunks and the end left in %d writes, want 4", n)
	}
}
