// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// syncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testEngine is an engine behind an httptest server, running.
type testEngine struct {
	*fakeengine.Engine
	url    string
	stdout *syncBuffer
	stderr *syncBuffer
	runErr chan error
}

// startEngine builds and runs an engine for cfg (ServedName defaults to
// "m") and waits until it is ready unless wait is false.
func startEngine(t *testing.T, cfg fakeengine.Config, wait bool) *testEngine {
	t.Helper()
	if cfg.ServedName == "" {
		cfg.ServedName = "m"
	}
	te := &testEngine{stdout: &syncBuffer{}, stderr: &syncBuffer{}, runErr: make(chan error, 1)}
	cfg.Stdout, cfg.Stderr = te.stdout, te.stderr
	e, err := fakeengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	te.Engine = e
	srv := httptest.NewServer(e.Handler())
	te.url = srv.URL
	ctx, cancel := context.WithCancel(context.Background())
	go func() { te.runErr <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel() // ends stalled generations, so the server can close
		<-te.runErr
		srv.CloseClientConnections()
		srv.Close()
	})
	if wait {
		select {
		case <-e.Ready():
		case err := <-te.runErr:
			t.Fatalf("engine ended during startup: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("engine not ready")
		}
	}
	return te
}

// chatBody renders a chat request.
func chatBody(model, prompt string, extra map[string]any) string {
	body := map[string]any{
		"model":    model,
		"messages": []map[string]any{{"role": "user", "content": prompt}},
	}
	for k, v := range extra {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	return string(b)
}

// do sends a request and returns the status and body.
func do(t *testing.T, method, url, body string, header map[string]string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	// One connection per request: the llama.cpp flavour closes its
	// connection after every stream (as llama-server does), and a client
	// reusing it could send the next request on a connection being closed.
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data, resp.Header
}

// chat posts a chat request to the engine.
func (te *testEngine) chat(t *testing.T, body string) (int, []byte) {
	t.Helper()
	status, data, _ := do(t, http.MethodPost, te.url+"/v1/chat/completions", body, nil)
	return status, data
}

// stats reads /fake/stats.
func (te *testEngine) stats(t *testing.T) fakeengine.Stats {
	t.Helper()
	status, data, _ := do(t, http.MethodGet, te.url+"/fake/stats", "", nil)
	if status != http.StatusOK {
		t.Fatalf("stats: %d %s", status, data)
	}
	var s fakeengine.Stats
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// metrics reads /metrics into name → value (samples without labels).
func (te *testEngine) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	status, data, h := do(t, http.MethodGet, te.url+"/metrics", "", nil)
	if status != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("metrics: %d %s %s", status, h.Get("Content-Type"), data)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[name] = v
	}
	return out
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}

// sseEvents splits a complete SSE body into its events' data, checking
// the framing: every event is "data: <payload>\n\n".
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	s := string(body)
	if !strings.HasSuffix(s, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", s)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("bad event %q", ev)
		}
		out = append(out, data)
	}
	return out
}

// openStream is a streamed chat request in flight: its response, a reader
// of its events, and cancel, which hangs up.
type openStream struct {
	resp   *http.Response
	rd     *bufio.Reader
	cancel context.CancelFunc
}

// startStream posts a streamed chat in the background. ready receives the
// outcome of the request once the response headers arrive, which the
// engine sends when the request gets a slot.
func startStream(t *testing.T, url, body string, header map[string]string) (*openStream, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	s := &openStream{cancel: cancel}
	ready := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			s.resp = resp
			s.rd = bufio.NewReader(resp.Body)
		}
		ready <- err
	}()
	return s, ready
}

// next reads one event's data.
func (s *openStream) next(t *testing.T) string {
	t.Helper()
	line, err := s.rd.ReadString('\n')
	if err != nil {
		t.Fatalf("read event: %v", err)
	}
	blank, err := s.rd.ReadString('\n')
	if err != nil || blank != "\n" {
		t.Fatalf("event not followed by a blank line: %q %v", blank, err)
	}
	data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
	if !ok {
		t.Fatalf("bad event line %q", line)
	}
	return data
}
