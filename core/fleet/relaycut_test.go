// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package fleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/takeover"
)

// cutBody is a host's streamed answer that sends its parts, then breaks
// off with err (io.EOF: it ends properly).
type cutBody struct {
	parts [][]byte
	err   error
}

func (b *cutBody) Read(p []byte) (int, error) {
	if len(b.parts) == 0 {
		return 0, b.err
	}
	n := copy(p, b.parts[0])
	if b.parts[0] = b.parts[0][n:]; len(b.parts[0]) == 0 {
		b.parts = b.parts[1:]
	}
	return n, nil
}

func (b *cutBody) Close() error { return nil }

// errLinkDown is how a read of a relayed stream whose host died ends.
var errLinkDown = errors.New("stream error: stream ID 3; CANCEL; received from peer")

// hostStream is a host's chat stream: one whole event, then half of the
// next, then the host's link goes down.
func hostStream(err error) *http.Response {
	body := &cutBody{parts: [][]byte{
		[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"once\"}}]}\n\n"),
		[]byte("data: {\"choices\":[{\"delta\":{\"con"),
	}, err: err}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body}
}

// relayTakenOver relays resp as a taken-over stream of path and returns
// what the client read: the body, and whether the chunked coding ended
// properly.
func relayTakenOver(t *testing.T, ctx context.Context, resp *http.Response, path string) (string, bool) {
	t.Helper()
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
	var u undo
	u.push(func() { _ = server.Close() })
	var head bytes.Buffer
	takeover.WriteHead(&head, resp.StatusCode, resp.Header, true)
	rl := hostReply{resp: resp, cancel: func() {}, ctx: ctx, host: "gpu-1"}
	go relayTaken(&takeover.Conn{Conn: server}, head.Bytes(), rl, path, &u, nil)
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := http.ReadResponse(bufio.NewReader(client), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(got.Body)
	return string(b), err == nil
}

// TestRelay_AHostStreamThatBreaksOffEndsWithACodedEvent: the host dies in
// the middle of a streamed answer (the soak's fleet profile, seed
// 3430540283058568128: a kill -9 of a host agent). The server, still
// there, ends the client's stream as a standalone role ends one whose
// engine broke off: the whole events so far, a host_unreachable event,
// [DONE], and the chunked coding's end; the half event never reaches the
// client. Before, the client got the half event and a cut connection
// ("unexpected EOF"), with no reason.
func TestRelay_AHostStreamThatBreaksOffEndsWithACodedEvent(t *testing.T) {
	check := func(t *testing.T, body string, whole bool) {
		t.Helper()
		if !whole {
			t.Fatalf("the stream was cut (the chunked coding did not end); read:\n%s", body)
		}
		if strings.Contains(body, `"con`+"\n") || strings.Count(body, `{"choices"`) != 1 {
			t.Fatalf("the client got the half event; read:\n%s", body)
		}
		if !strings.Contains(body, `data: {"error":{"code":"host_unreachable"`) || !strings.HasSuffix(body, "\n\ndata: [DONE]\n\n") {
			t.Fatalf("the stream does not end with host_unreachable then [DONE]; read:\n%s", body)
		}
		if !strings.Contains(body, "gpu-1") {
			t.Fatalf("the event does not name the host; read:\n%s", body)
		}
	}
	t.Run("taken over", func(t *testing.T) {
		body, whole := relayTakenOver(t, context.Background(), hostStream(errLinkDown), "/v1/chat/completions")
		check(t, body, whole)
	})
	t.Run("on net/http", func(t *testing.T) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		aborted := func() (aborted bool) {
			defer func() { aborted = recover() != nil }()
			copyAnswer(w, r, hostReply{resp: hostStream(errLinkDown), ctx: context.Background(), host: "gpu-1"})
			return false
		}()
		check(t, w.Body.String(), !aborted)
	})
	t.Run("the server stopping", func(t *testing.T) {
		// Its drain timeout over, a stopping server cuts what is left: the
		// client is told so, as a standalone role's drain tells it.
		stopping := make(chan struct{})
		close(stopping)
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		copyAnswer(w, r, hostReply{resp: hostStream(errLinkDown), ctx: context.Background(), host: "gpu-1", stopping: stopping})
		if body := w.Body.String(); !strings.Contains(body, `data: {"error":{"code":"shutting_down"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("a stream the stopping server cut does not end with shutting_down then [DONE]; read:\n%s", body)
		}
	})
	t.Run("messages", func(t *testing.T) {
		body, whole := relayTakenOver(t, context.Background(), hostStream(errLinkDown), "/v1/messages")
		if !whole || !strings.HasSuffix(body, "\n\n") || !strings.Contains(body, "event: error\ndata: {\"type\":\"error\"") ||
			!strings.Contains(body, `"code":"host_unreachable"`) {
			t.Fatalf("a Messages stream does not end with Anthropic's error event (whole %v); read:\n%s", whole, body)
		}
	})
}

// TestRelay_AHungUpStreamIsCut: when the client hung up (the relayed
// stream's context ended) nothing is owed: no event, no proper end.
func TestRelay_AHungUpStreamIsCut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	body, whole := relayTakenOver(t, ctx, hostStream(context.Canceled), "/v1/chat/completions")
	if whole || strings.Contains(body, "host_unreachable") {
		t.Fatalf("a hung-up stream got an ending (whole %v); read:\n%s", whole, body)
	}
}

// TestRelay_EndsWholeEventsOnly: a stream is written in whole events: an
// event split across reads leaves once its end arrived, and what remains
// at a proper end goes as it is.
func TestRelay_EndsWholeEventsOnly(t *testing.T) {
	var ev sseRelay
	steps := []struct{ in, out string }{
		{"data: a\n\nda", "data: a\n\n"},
		{"ta: b", ""},
		{"\n\n: c\r\n\r\ndata: d", "data: b\n\n: c\r\n\r\n"},
		{"\n\n", "data: d\n\n"},
	}
	for i, s := range steps {
		if got := string(ev.whole([]byte(s.in))); got != s.out {
			t.Fatalf("step %d: wrote %q, want %q", i, got, s.out)
		}
	}
	ev.whole([]byte("data: tail"))
	if got := string(ev.rest()); got != "data: tail" {
		t.Fatalf("the rest at the end: %q", got)
	}
}

// TestRelay_LastEventEndFindsTheLastSeparator: the backward scan finds
// what searching for each of SSE's three separators finds (the end just
// past the last one), on every string of up to 8 bytes over the bytes
// that matter, and on a read that ends mid-event after many events.
func TestRelay_LastEventEndFindsTheLastSeparator(t *testing.T) {
	want := func(b []byte) int {
		end := 0
		for _, sep := range []string{"\n\n", "\r\n\r\n", "\r\r"} {
			if i := bytes.LastIndex(b, []byte(sep)); i >= 0 && i+len(sep) > end {
				end = i + len(sep)
			}
		}
		return end
	}
	alphabet := []byte("\n\ra")
	var walk func(b []byte)
	walk = func(b []byte) {
		if got, w := lastEventEnd(b), want(b); got != w {
			t.Fatalf("lastEventEnd(%q) = %d, want %d", b, got, w)
		}
		if len(b) == 8 {
			return
		}
		for _, c := range alphabet {
			walk(append(b, c))
		}
	}
	walk(nil)
	long := []byte(strings.Repeat("data: {\"a\":1}\n\n", 100) + "data: {\"b\"")
	if got, w := lastEventEnd(long), want(long); got != w {
		t.Fatalf("long read: %d, want %d", got, w)
	}
}

// TestRelay_WholeEventsWithoutCopies: a burst that ends mid-event holds its
// rest in a pooled buffer and joins it to the next read without allocating;
// once nothing waits, the relay holds no buffer (an open stream stays
// small).
func TestRelay_WholeEventsWithoutCopies(t *testing.T) {
	var ev sseRelay
	first := []byte(strings.Repeat("data: {\"a\":1}\n\n", 60) + "data: {\"b\"")
	second := []byte(":2}\n\n")
	allocs := testing.AllocsPerRun(200, func() {
		if out := ev.whole(first); len(out) != len(first)-len("data: {\"b\"") {
			t.Fatalf("wrote %d bytes", len(out))
		}
		if out := ev.whole(second); !bytes.Equal(out, []byte("data: {\"b\":2}\n\n")) {
			t.Fatalf("wrote %q", out)
		}
	})
	if allocs >= 1 {
		t.Fatalf("%.1f allocations per burst that ends mid-event, want none", allocs)
	}
	ev.whole([]byte("data: c\n\n"))
	if ev.pending != nil || ev.joined != nil {
		t.Fatal("the relay holds a buffer with nothing waiting")
	}
}
