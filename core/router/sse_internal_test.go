// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// sseHead is the head of an engine's event stream; framing is its
// Transfer-Encoding or Content-Length line (or nothing: close-delimited).
func sseHead(framing string) string {
	return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + framing + "\r\n"
}

// readerOver reads the head from conn as the engine client does and
// returns the reader of the body.
func readerOver(t *testing.T, conn net.Conn, max int) (*sseReader, *engineCall) {
	t.Helper()
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(conn)
	resp, err := http.ReadResponse(br, postRequest)
	if err != nil {
		t.Fatalf("read head: %v", err)
	}
	call := &engineCall{conn: conn, br: br, Resp: resp, cut: &cutter{}, close: resp.Close}
	return newSSEReader(call, max), call
}

// events reads every event and the error that ended them.
func events(s *sseReader) ([]string, error) {
	var out []string
	for {
		ev, err := s.next()
		if err != nil {
			return out, err
		}
		out = append(out, string(ev))
	}
}

// chunked encodes body as chunks of the given sizes (the rest in one),
// with an extension on the first and a trailer.
func chunked(body string, sizes ...int) string {
	var b strings.Builder
	for i, n := range sizes {
		if n > len(body) {
			n = len(body)
		}
		if n == 0 {
			continue
		}
		b.WriteString(strings.ToUpper(strings.TrimLeft(hex(n), "0")))
		if i == 0 {
			b.WriteString(";ext=1")
		}
		b.WriteString("\r\n" + body[:n] + "\r\n")
		body = body[n:]
	}
	if body != "" {
		b.WriteString(hex(len(body)) + "\r\n" + body + "\r\n")
	}
	b.WriteString("0\r\nX-Trailer: 1\r\n\r\n")
	return b.String()
}

func hex(n int) string {
	const d = "0123456789abcdef"
	s := ""
	for ; n > 0; n >>= 4 {
		s = string(d[n&15]) + s
	}
	if s == "" {
		s = "0"
	}
	return s
}

const sseBody = "data: {\"a\":1}\n\n: comment\n\ndata: {\"b\":\"x\"}\r\n\r\ndata: [DONE]\n\n"

var sseEvents = []string{`data: {"a":1}`, `: comment`, `data: {"b":"x"}` + "\r", `data: [DONE]`}

// TestSSEReader_Framings feeds each framing split at every byte (the
// pieces arrive one read at a time over a pipe) and checks the events, the
// end and whether the connection may be reused.
func TestSSEReader_Framings(t *testing.T) {
	cases := []struct {
		name      string
		wire      string
		closeConn bool // the engine closes after the body
		want      []string
		wantErr   error
		reusable  bool
		oneRead   bool // reuse is checked only when the whole answer arrives in one read
	}{
		{name: "chunked", wire: sseHead("Transfer-Encoding: chunked\r\n") + chunked(sseBody, 5, 17, 1), want: sseEvents, wantErr: io.EOF, reusable: true},
		{name: "chunked, one chunk per event", wire: sseHead("Transfer-Encoding: chunked\r\n") + chunked(sseBody, 15, 11, 19), want: sseEvents, wantErr: io.EOF, reusable: true},
		{name: "content length", wire: sseHead("Content-Length: "+strconv.Itoa(len(sseBody))+"\r\n") + sseBody, want: sseEvents, wantErr: io.EOF, reusable: true},
		{name: "close delimited", wire: sseHead("") + sseBody, closeConn: true, want: sseEvents, wantErr: io.EOF},
		{name: "last event without its blank line", wire: sseHead("") + "data: {\"a\":1}\n\ndata: [DONE]", closeConn: true, want: []string{`data: {"a":1}`, `data: [DONE]`}, wantErr: io.EOF},
		{name: "chunked, cut short", wire: sseHead("Transfer-Encoding: chunked\r\n") + "f\r\ndata: {\"a\":1}\n\n\r\n5\r\ndata:", closeConn: true, want: []string{`data: {"a":1}`, `data:`}, wantErr: io.ErrUnexpectedEOF},
		{name: "bad chunk size", wire: sseHead("Transfer-Encoding: chunked\r\n") + "zz\r\ndata: x\n\n\r\n", closeConn: true, wantErr: errChunkedCoding},
		{name: "bytes after the body", wire: sseHead("Transfer-Encoding: chunked\r\n") + chunked(sseBody) + "junk", want: sseEvents, wantErr: io.EOF, oneRead: true},
		{name: "event over the bound", wire: sseHead("") + "data: " + strings.Repeat("x", 200) + "\n\n", closeConn: true, wantErr: errTooLarge},
	}
	for _, c := range cases {
		head := strings.Index(c.wire, "\r\n\r\n") + 4
		for split := head; split <= len(c.wire); split++ {
			for _, step := range []int{1, 7, len(c.wire)} {
				if split < len(c.wire) && step == len(c.wire) {
					continue
				}
				engine, router := net.Pipe()
				go func() {
					// The head and what follows up to split in one write (the
					// head's reader may buffer body bytes), then steps.
					_, _ = engine.Write([]byte(c.wire[:split]))
					for rest := c.wire[split:]; rest != ""; {
						n := min(step, len(rest))
						if _, err := engine.Write([]byte(rest[:n])); err != nil {
							return
						}
						rest = rest[n:]
					}
					if c.closeConn {
						engine.Close()
					}
				}()
				s, _ := readerOver(t, router, 100)
				got, err := events(s)
				s.release()
				router.Close()
				engine.Close()
				if !errors.Is(err, c.wantErr) || strings.Join(got, "|") != strings.Join(c.want, "|") {
					t.Fatalf("%s, split %d, step %d: events %q, %v; want %q, %v", c.name, split, step, got, err, c.want, c.wantErr)
				}
				if (!c.oneRead || split == len(c.wire)) && s.reusable() != c.reusable {
					t.Fatalf("%s, split %d, step %d: reusable %v, want %v", c.name, split, step, s.reusable(), c.reusable)
				}
			}
		}
	}
}

// TestSSEReader_LargeEventGrowsTheBuffer relays an event larger than the
// pooled buffer and under the bound.
func TestSSEReader_LargeEventGrowsTheBuffer(t *testing.T) {
	engine, router := net.Pipe()
	defer router.Close()
	big := "data: " + strings.Repeat("y", 3*eventBufSize) + "\n\n"
	go func() {
		_, _ = engine.Write([]byte(sseHead("Transfer-Encoding: chunked\r\n") + chunked(big+"data: [DONE]\n\n", 1000, 5000)))
		engine.Close()
	}()
	s, _ := readerOver(t, router, 64<<10)
	got, err := events(s)
	if err != io.EOF || len(got) != 2 || got[0] != big[:len(big)-2] || got[1] != "data: [DONE]" {
		t.Fatalf("got %d events (%v), first %d bytes", len(got), err, len(got[0]))
	}
}

func TestDecodeChunk(t *testing.T) {
	in := `{"id":"c1","created":7,"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi","tool_calls":[{"index":1,"id":"t","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]},"finish_reason":"stop"},{"index":1,"delta":{"reasoning_content":"r"}}],"usage":{"prompt_tokens":3},"timings":{"prompt_ms":1}}`
	var c chunkHead
	if err := decodeChunk([]byte(in), &c); err != nil {
		t.Fatal(err)
	}
	if c.ID != "c1" || c.Created != 7 || len(c.Choices) != 2 || string(c.Usage) != `{"prompt_tokens":3}` || string(c.Timings) != `{"prompt_ms":1}` {
		t.Fatalf("chunk %+v", c)
	}
	ch := c.Choices[0]
	if ch.Delta.Role != "assistant" || *ch.Delta.Content != "Hi" || string(ch.FinishReason) != `"stop"` || !ch.Delta.hasContent() {
		t.Fatalf("choice 0 %+v", ch)
	}
	if tc := ch.Delta.ToolCalls; len(tc) != 1 || tc[0].Index != 1 || tc[0].ID != "t" || tc[0].Function.Name != "f" || tc[0].Function.Arguments != `{"x":` {
		t.Fatalf("tool calls %+v", tc)
	}
	if d := c.Choices[1].Delta; c.Choices[1].Index != 1 || *d.ReasoningContent != "r" || !d.hasContent() {
		t.Fatalf("choice 1 %+v", c.Choices[1])
	}
	for _, bad := range []string{`{"choices":[{"delta":{"content":1}}]}`, `{"choices":[{"delta":{"tool_calls":[{"index":"x"}]}}]}`, `[`} {
		var c chunkHead
		if decodeChunk([]byte(bad), &c) == nil {
			t.Fatalf("decodeChunk(%s) succeeded", bad)
		}
	}
}
