// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package router_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// scripted is an engine that streams what the test tells it, when it says
// so: each string sent on steps is written and flushed; closing steps ends
// the answer. gone is closed when the router dropped the request.
type scripted struct {
	url   string
	steps chan string
	gone  chan struct{}
}

func startScripted(t *testing.T) *scripted {
	t.Helper()
	s := &scripted{steps: make(chan string), gone: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		for {
			select {
			case step, ok := <-s.steps:
				if !ok {
					return
				}
				_, _ = io.WriteString(w, step)
				_ = rc.Flush()
			case <-r.Context().Done():
				close(s.gone)
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// send makes the engine write one step (it blocks until the engine took
// it).
func (s *scripted) send(t *testing.T, step string) {
	t.Helper()
	select {
	case s.steps <- step:
	case <-s.gone:
		t.Fatal("the router dropped the engine request")
	case <-time.After(10 * time.Second):
		t.Fatal("the engine request never came")
	}
}

const (
	roleChunk    = "data: {\"id\":\"e-1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"
	contentChunk = "data: {\"id\":\"e-1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	finishChunk  = "data: {\"id\":\"e-1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"
)

// scriptedEnv is a router in front of a scripted engine.
func scriptedEnv(t *testing.T, o envOpts) (*env, *scripted) {
	t.Helper()
	s := startScripted(t)
	inner := o.ep
	o.ep = func(ep *structs.EngineEndpoint) {
		ep.BaseURL = s.url
		if inner != nil {
			inner(ep)
		}
	}
	return newEnv(t, o), s
}

// rawStream sends a streamed chat request on a plain connection, makes the
// engine send its first event, and returns the connection with a reader
// past the answer's head, and the head.
func rawStream(t *testing.T, e *env, s *scripted, extraHeaders string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	u, _ := url.Parse(e.srv.URL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := chatBody(true, "")
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", extraHeaders, len(body), body)
	s.send(t, roleChunk)
	br := bufio.NewReader(c)
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("head: %v (so far %q)", err, head.String())
		}
		head.WriteString(line)
		if line == "\r\n" {
			return c, br, head.String()
		}
	}
}

// readChunk reads one chunk of the chunked coding ("" for the last one).
func readChunk(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("chunk size: %v", err)
	}
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "%x", &n); err != nil {
		t.Fatalf("chunk size line %q: %v", line, err)
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(br, b); err != nil {
		t.Fatalf("chunk: %v", err)
	}
	if string(b[n:]) != "\r\n" {
		t.Fatalf("chunk %q does not end with CRLF", b)
	}
	if n == 0 {
		// The last chunk: an empty trailer.
		return ""
	}
	return string(b[:n])
}

// readUntil reads chunks until one contains want and returns all read.
func readUntil(t *testing.T, br *bufio.Reader, want string) string {
	t.Helper()
	var all strings.Builder
	for !strings.Contains(all.String(), want) {
		c := readChunk(t, br)
		if c == "" {
			t.Fatalf("the answer ended before %q: %q", want, all.String())
		}
		all.WriteString(c)
	}
	return all.String()
}

func TestRouter_StreamTakenOverFromNetHTTP(t *testing.T) {
	led := &ledger{}
	e, s := scriptedEnv(t, envOpts{router: func(c *router.Config) { c.RequestLog = led }})
	c, br, head := rawStream(t, e, s, "X-Request-Id: client-9\r\n")
	// net/http's head, written by the router.
	for _, h := range []string{"HTTP/1.1 200 OK\r\n", "Transfer-Encoding: chunked\r\n", "Date: ",
		"Content-Type: text/event-stream\r\n", "Cache-Control: no-cache\r\n", "X-Request-Id: client-9\r\n", "X-Capyctl-Request-Id: capy-"} {
		if !strings.Contains(head, h) {
			t.Fatalf("head %q lacks %q", head, h)
		}
	}
	if strings.Contains(head, "Connection:") {
		t.Fatalf("head %q: the connection is kept alive", head)
	}
	first := readUntil(t, br, `"role"`)
	s.send(t, contentChunk)
	body := readUntil(t, br, `"hi"`)
	if n := e.rt.Open(); n != 1 {
		t.Fatalf("open taken-over streams = %d, want 1", n)
	}
	if m := scrape(t, e); !strings.Contains(m, "\ncapyctl_streams_taken_over 1\n") {
		t.Fatalf("metrics lack capyctl_streams_taken_over 1:\n%s", m)
	}
	s.send(t, finishChunk)
	close(s.steps)
	rest := readUntil(t, br, "data: [DONE]")
	if i, j := strings.Index(rest, ": x-capyctl-metrics {"), strings.Index(rest, "data: [DONE]"); i < 0 || i > j {
		t.Fatalf("no metrics comment before [DONE]: %q", rest)
	}
	if last := readChunk(t, br); last != "" {
		t.Fatalf("after [DONE]: %q", last)
	}
	if strings.Contains(body, `"e-1"`) || strings.Contains(rest, `"model":"m"`) {
		t.Fatalf("engine id or model relayed: %q %q", body, rest)
	}
	waitFor(t, "the stream to be forgotten", func() bool { return e.rt.Open() == 0 })
	// The record comes after the answer, before the stream is forgotten.
	recs := led.all()
	if len(recs) != 1 || recs[0].Outcome != "completed" || recs[0].Status != 200 || !recs[0].Stream ||
		recs[0].BytesOut != int64(len(first)+len(body)+len(rest)) || recs[0].PromptTokens != 3 || recs[0].TTFBMs <= 0 {
		t.Fatalf("records %+v (answer of %d bytes)", recs, len(first)+len(body)+len(rest))
	}
	waitFor(t, "the outcome", func() bool {
		return strings.Contains(scrape(t, e), `capyctl_requests_total{api="chat",deployment="demo",outcome="completed"} 1`)
	})
	waitFor(t, "idle", e.idle)
	// The connection waits for the next request, which net/http serves.
	if n := e.rt.IdleConns(); n != 1 {
		t.Fatalf("idle connections = %d, want 1", n)
	}
	nextRequest(t, c, br)
	if n := e.rt.IdleConns(); n != 0 {
		t.Fatalf("idle connections = %d after the next request, want 0", n)
	}
}

// openTakenOver opens a stream and reads until its first content, so that
// it is taken over.
func openTakenOver(t *testing.T, e *env, s *scripted) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, br, _ := rawStream(t, e, s, "")
	readUntil(t, br, `"role"`)
	// The router took the stream over before it wrote its first bytes.
	if n := e.rt.Open(); n != 1 {
		t.Fatalf("open taken-over streams = %d, want 1", n)
	}
	s.send(t, contentChunk)
	readUntil(t, br, `"hi"`)
	return c, br
}

// lastEvents reads the rest of the answer to its last chunk and returns
// the data payloads.
// idleAfterTakenOver ends a taken-over stream and waits for its connection
// to wait for the client's next request.
func idleAfterTakenOver(t *testing.T, o ...envOpts) (*env, net.Conn, *bufio.Reader) {
	t.Helper()
	e, s := scriptedEnv(t, append(o, envOpts{})[0])
	c, br := openTakenOver(t, e, s)
	s.send(t, finishChunk)
	close(s.steps)
	lastEvents(t, br)
	waitFor(t, "the connection to wait for a next request", func() bool { return e.rt.IdleConns() == 1 })
	return e, c, br
}

func lastEvents(t *testing.T, br *bufio.Reader) []string {
	t.Helper()
	var all strings.Builder
	for {
		c := readChunk(t, br)
		if c == "" {
			break
		}
		all.WriteString(c)
	}
	data, _ := sseLines(all.String())
	return data
}

// closed reads the connection's end.
func closed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the answer: %d, %v; want the connection closed", n, err)
	}
}

func TestRouter_TakenOverStreamCuts(t *testing.T) {
	cases := []struct {
		name    string
		spec    func(*structs.Deployment)
		engine  func(t *testing.T, s *scripted)
		code    string
		outcome string
	}{
		{
			name: "engine error event",
			engine: func(t *testing.T, s *scripted) {
				s.send(t, "data: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n")
				close(s.steps)
			},
			code:    "engine_error",
			outcome: "engine_error",
		},
		{
			name:    "engine stalls",
			spec:    func(d *structs.Deployment) { d.Limits.StreamIdle = structs.Duration(50 * time.Millisecond) },
			engine:  func(t *testing.T, s *scripted) {},
			code:    "stream_stalled",
			outcome: "stream_idle",
		},
		{
			name: "chunk over the bound",
			engine: func(t *testing.T, s *scripted) {
				s.send(t, "data: {\"choices\":[{\"delta\":{\"content\":\""+strings.Repeat("x", 70<<10)+"\"}}]}\n\n")
			},
			code:    "chunk_too_large",
			outcome: "chunk_too_large",
		},
		{
			name:    "engine ends without finishing",
			engine:  func(t *testing.T, s *scripted) { close(s.steps) },
			code:    "engine_error",
			outcome: "engine_error",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, s := scriptedEnv(t, envOpts{spec: c.spec})
			_, br := openTakenOver(t, e, s)
			c.engine(t, s)
			data := lastEvents(t, br)
			if len(data) < 2 || data[len(data)-1] != "[DONE]" || errCode(data[len(data)-2]) != c.code {
				t.Fatalf("events %q, want a %s error event then [DONE]", data, c.code)
			}
			if c.code != "engine_error" {
				<-s.gone // cut on the engine
			}
			waitFor(t, "the outcome", func() bool {
				return strings.Contains(scrape(t, e), `outcome="`+c.outcome+`"} 1`)
			})
			waitFor(t, "the stream to be forgotten", func() bool { return e.rt.Open() == 0 })
			waitFor(t, "idle", e.idle)
		})
	}
}

func TestRouter_HangUpAfterTakeOver(t *testing.T) {
	cases := []struct {
		name    string
		content bool
	}{
		{"while the engine is silent before its first token", false},
		{"mid-stream", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, s := scriptedEnv(t, envOpts{})
			conn, br, _ := rawStream(t, e, s, "")
			readUntil(t, br, `"role"`)
			if n := e.rt.Open(); n != 1 {
				t.Fatalf("open taken-over streams = %d, want 1", n)
			}
			if c.content {
				s.send(t, contentChunk)
				readUntil(t, br, `"hi"`)
			}
			e.lc.noReading.Store(true)
			conn.Close()
			select {
			case <-s.gone:
			case <-time.After(10 * time.Second):
				t.Fatal("the engine request was not dropped after the hang-up")
			}
			e.heldUntilReading(t, router.OutcomeCancelled, 1)
			waitFor(t, "the stream to be forgotten", func() bool { return e.rt.Open() == 0 })
			e.settleAfterCuts(t)
		})
	}
}

func TestRouter_StreamCompleteAtItsFirstFlushStaysOnNetHTTP(t *testing.T) {
	e, s := scriptedEnv(t, envOpts{})
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
		if err != nil {
			done <- nil
			return
		}
		done <- resp
	}()
	s.send(t, roleChunk+contentChunk+finishChunk)
	close(s.steps)
	resp := <-done
	if resp == nil {
		t.Fatal("request failed")
	}
	body := readBody(t, resp)
	if resp.Close || resp.Header.Get("Connection") != "" {
		t.Fatalf("a complete answer closed its connection: %v %q", resp.Close, resp.Header)
	}
	if data, _ := sseLines(body); len(data) < 3 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream %q", body)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_DrainLetsTakenOverStreamsFinish(t *testing.T) {
	e, s := scriptedEnv(t, envOpts{})
	_, br := openTakenOver(t, e, s)
	drained := make(chan struct{})
	go func() {
		e.rt.Drain(context.Background())
		close(drained)
	}()
	// The stream goes on while the router drains.
	s.send(t, contentChunk)
	readUntil(t, br, `"hi"`)
	s.send(t, finishChunk)
	close(s.steps)
	data := lastEvents(t, br)
	if len(data) < 2 || data[len(data)-1] != "[DONE]" || errCode(data[len(data)-2]) != "" {
		t.Fatalf("events %q", data)
	}
	closed(t, br) // draining: no keep-alive
	<-drained
	waitFor(t, "idle", e.idle)
	// Once draining, streams stay on net/http.
	s2 := startScripted(t)
	e.ep.BaseURL = s2.url
	e.publish(true)
	_, br2, _ := rawStream(t, e, s2, "")
	readUntil(t, br2, `"role"`)
	if n := e.rt.Open(); n != 0 {
		t.Fatalf("a stream was taken over while draining")
	}
	s2.send(t, finishChunk)
	close(s2.steps)
	readUntil(t, br2, "[DONE]")
	waitFor(t, "idle", e.idle)
}

func TestRouter_DrainCutsTakenOverStreamsWhenItsTimeEnds(t *testing.T) {
	led := &ledger{}
	e, s := scriptedEnv(t, envOpts{router: func(c *router.Config) { c.RequestLog = led }})
	_, br := openTakenOver(t, e, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e.rt.Drain(ctx)
	// Drain returns once the cut streams are recorded.
	if recs := led.all(); len(recs) != 1 || recs[0].Outcome != router.OutcomeShutdown || recs[0].Code != "shutting_down" {
		t.Fatalf("records %+v", recs)
	}
	data := lastEvents(t, br)
	if len(data) < 2 || data[len(data)-1] != "[DONE]" || errCode(data[len(data)-2]) != "shutting_down" {
		t.Fatalf("events %q, want a shutting_down error event then [DONE]", data)
	}
	closed(t, br)
	<-s.gone
	if n := e.rt.Open(); n != 0 {
		t.Fatalf("%d streams open after Drain", n)
	}
	waitFor(t, "the outcome", func() bool {
		return strings.Contains(scrape(t, e), `outcome="`+router.OutcomeShutdown+`"} 1`)
	})
	e.settleAfterCuts(t)
}

func TestRouter_PipelinedRequestAfterATakenOverStream(t *testing.T) {
	e, s := scriptedEnv(t, envOpts{})
	u, _ := url.Parse(e.srv.URL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := chatBody(true, "")
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Two requests in one write: the second is pipelined.
	if _, err := io.WriteString(c, req+req); err != nil {
		t.Fatal(err)
	}
	s.send(t, roleChunk)
	br := bufio.NewReader(c)
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	// The pipelined request is dropped and the connection closes after
	// the answer, as the head says.
	if !strings.HasPrefix(head.String(), "HTTP/1.1 200 OK\r\n") || !strings.Contains(head.String(), "Connection: close\r\n") {
		t.Fatalf("head %q", head.String())
	}
	readUntil(t, br, `"role"`)
	s.send(t, contentChunk)
	s.send(t, finishChunk)
	close(s.steps)
	data := lastEvents(t, br)
	if len(data) < 2 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("events %q", data)
	}
	closed(t, br)
	waitFor(t, "idle", e.idle)
}

func TestRouter_KeepStreamsOnNetHTTP(t *testing.T) {
	keep := func(c *router.Config) { c.KeepStreamsOnNetHTTP = true }
	t.Run("complete", func(t *testing.T) {
		e, s := scriptedEnv(t, envOpts{router: keep})
		_, br, _ := rawStream(t, e, s, "")
		readUntil(t, br, `"role"`)
		s.send(t, contentChunk)
		readUntil(t, br, `"hi"`)
		if n := e.rt.Open(); n != 0 {
			t.Fatalf("open taken-over streams = %d, want 0", n)
		}
		s.send(t, finishChunk)
		close(s.steps)
		readUntil(t, br, "data: [DONE]")
		if last := readChunk(t, br); last != "" {
			t.Fatalf("after [DONE]: %q", last)
		}
		waitFor(t, "idle", e.idle)
	})
	t.Run("hang-up", func(t *testing.T) {
		e, s := scriptedEnv(t, envOpts{router: keep})
		c, br, _ := rawStream(t, e, s, "")
		readUntil(t, br, `"role"`)
		c.Close()
		<-s.gone
		e.settleAfterCuts(t)
	})
}

func TestRouter_NextRequestOnATakenOverStreamsConnection(t *testing.T) {
	t.Run("sent before the answer ended", func(t *testing.T) {
		e, s := scriptedEnv(t, envOpts{})
		c, br := openTakenOver(t, e, s)
		io.WriteString(c, modelsRequest)
		s.send(t, finishChunk)
		close(s.steps)
		if data := lastEvents(t, br); len(data) == 0 || data[len(data)-1] != "[DONE]" {
			t.Fatalf("events %q", data)
		}
		modelsAnswer(t, br)
		waitFor(t, "idle", e.idle)
	})
	t.Run("the client closes the idle connection", func(t *testing.T) {
		e, c, _ := idleAfterTakenOver(t)
		c.Close()
		waitFor(t, "the idle connection to be closed", func() bool { return e.rt.IdleConns() == 0 })
		waitFor(t, "idle", e.idle)
	})
	t.Run("the server's idle timeout passes", func(t *testing.T) {
		// A connection waiting for a next request after a taken-over
		// stream is closed when the server's idle timeout passes, as
		// net/http closes its own idle connections.
		e, c, br := idleAfterTakenOver(t, envOpts{idleTimeout: 100 * time.Millisecond})
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		closed(t, br)
		waitFor(t, "the idle connection to be forgotten", func() bool { return e.rt.IdleConns() == 0 })
	})
	t.Run("the role drains", func(t *testing.T) {
		e, _, br := idleAfterTakenOver(t)
		e.rt.Drain(context.Background())
		closed(t, br)
		if n := e.rt.IdleConns(); n != 0 {
			t.Fatalf("idle connections = %d after Drain", n)
		}
	})
	t.Run("the client asked to close", func(t *testing.T) {
		e, s := scriptedEnv(t, envOpts{})
		_, br, head := rawStream(t, e, s, "Connection: close\r\n")
		if !strings.Contains(head, "Connection: close\r\n") {
			t.Fatalf("head %q", head)
		}
		readUntil(t, br, `"role"`)
		s.send(t, finishChunk)
		close(s.steps)
		lastEvents(t, br)
		closed(t, br)
		waitFor(t, "idle", e.idle)
	})
}

// modelsRequest is a request net/http serves without the engine.
const modelsRequest = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"

// nextRequest sends the next request on a connection and reads its
// answer.
func nextRequest(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := io.WriteString(c, modelsRequest); err != nil {
		t.Fatal(err)
	}
	modelsAnswer(t, br)
}

// modelsAnswer reads the answer to modelsRequest.
func modelsAnswer(t *testing.T, br *bufio.Reader) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the next request on the connection: %v", err)
	}
	if b := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(b, `"demo"`) {
		t.Fatalf("the next request on the connection: %d %s", resp.StatusCode, b)
	}
}

func TestRouter_YoungStreamStaysOnNetHTTP(t *testing.T) {
	// A stream stays young for the whole of the first two cases; the
	// third waits for its stream to grow old.
	young := func(c *router.Config) { c.TakeOverAfter = time.Minute }
	const after = 200 * time.Millisecond
	t.Run("a stream that ends young stays on net/http", func(t *testing.T) {
		led := &ledger{}
		e, s := scriptedEnv(t, envOpts{router: func(c *router.Config) { young(c); c.RequestLog = led }})
		c, br, head := rawStream(t, e, s, "")
		if !strings.Contains(head, "Transfer-Encoding: chunked\r\n") || !strings.Contains(head, "Content-Type: text/event-stream\r\n") {
			t.Fatalf("head %q", head)
		}
		first := readUntil(t, br, `"role"`)
		s.send(t, contentChunk)
		body := readUntil(t, br, `"hi"`)
		if n := e.rt.Open(); n != 0 {
			t.Fatalf("open taken-over streams = %d, want 0", n)
		}
		s.send(t, finishChunk)
		close(s.steps)
		rest := readUntil(t, br, "data: [DONE]")
		if last := readChunk(t, br); last != "" {
			t.Fatalf("after [DONE]: %q", last)
		}
		if strings.Contains(body, `"e-1"`) || !strings.Contains(rest, ": x-capyctl-metrics {") {
			t.Fatalf("answer %q %q", body, rest)
		}
		waitFor(t, "idle", e.idle)
		recs := led.all()
		if len(recs) != 1 || recs[0].Outcome != "completed" || recs[0].BytesOut != int64(len(first)+len(body)+len(rest)) || recs[0].PromptTokens != 3 {
			t.Fatalf("records %+v", recs)
		}
		if n := e.rt.Open(); n != 0 {
			t.Fatalf("open taken-over streams = %d, want 0", n)
		}
		// net/http kept the connection for the next request.
		nextRequest(t, c, br)
	})
	t.Run("a hang-up while young reaches the engine", func(t *testing.T) {
		e, s := scriptedEnv(t, envOpts{router: young})
		c, br, _ := rawStream(t, e, s, "")
		readUntil(t, br, `"role"`)
		c.Close()
		select {
		case <-s.gone:
		case <-time.After(10 * time.Second):
			t.Fatal("the engine request was not cut")
		}
		waitFor(t, "idle", e.idle)
	})
	t.Run("a stream that goes on is taken over at its first flush after TakeOverAfter", func(t *testing.T) {
		e, s := scriptedEnv(t, envOpts{router: func(c *router.Config) { c.TakeOverAfter = after }})
		c, br, _ := rawStream(t, e, s, "")
		readUntil(t, br, `"role"`)
		// The stream's age counts from when the router took the request,
		// which is before its first chunk arrived here (counted from
		// before the request was sent, a loaded machine that delivered it
		// late left the stream young at the flush below).
		start := time.Now()
		if n := e.rt.Open(); n != 0 {
			t.Fatalf("open taken-over streams = %d, want 0", n)
		}
		waitFor(t, "the stream to grow old", func() bool { return time.Since(start) > after })
		s.send(t, contentChunk)
		readUntil(t, br, `"hi"`)
		if n := e.rt.Open(); n != 1 {
			t.Fatalf("open taken-over streams = %d, want 1", n)
		}
		// The answer goes on in net/http's chunked coding, to its end.
		s.send(t, contentChunk)
		s.send(t, finishChunk)
		close(s.steps)
		if data := lastEvents(t, br); len(data) < 3 || data[len(data)-1] != "[DONE]" {
			t.Fatalf("events %q", data)
		}
		waitFor(t, "the stream to be forgotten", func() bool { return e.rt.Open() == 0 })
		waitFor(t, "idle", e.idle)
		nextRequest(t, c, br)
	})
}
