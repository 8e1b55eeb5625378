// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// countingListener counts the connections an engine holds open: accepted
// and not yet closed by the engine (which closes its side when the router
// closes its own).
type countingListener struct {
	net.Listener
	open atomic.Int64
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// startCountedEngine runs a fake engine on a counting listener.
func startCountedEngine(t *testing.T) (*countingListener, string) {
	t.Helper()
	e, err := fakeengine.New(fakeengine.Config{ServedName: "m", Stdout: io.Discard, Stderr: io.Discard, ShutdownGrace: time.Millisecond, Tokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-e.Ready()
	return ln, "http://" + inner.Addr().String()
}

// TestRouter_StoppedEngineConnectionsClosed: once the route table no
// longer has an engine ready (stopped, parked, replaced by a new launch on
// another port or socket), the router closes its idle connections to it.
// Before, they stayed pooled, keyed by an address no request would use
// again: every launch that served requests left open files in the role
// for good (found by the soak: the role's open files grew with the
// launches).
func TestRouter_StoppedEngineConnectionsClosed(t *testing.T) {
	ln, url := startCountedEngine(t)
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.BaseURL = url }})
	for i, stream := range []bool{false, true} {
		resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(stream, ""), nil)
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	waitFor(t, "the engine's connection pooled (held open)", func() bool { return ln.open.Load() >= 1 })
	// The instance stops: the table has it no more.
	e.publish(false)
	waitFor(t, "the router to close its idle connections to the stopped engine", func() bool { return ln.open.Load() == 0 })
	// Ready again: a request opens a new connection.
	e.publish(true)
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the instance came back: %d %s", resp.StatusCode, body)
	}
}

// TestRouter_DeletedDeploymentForgotten: a deployment the route table no
// longer has (deleted) is forgotten once it holds nothing: its admission
// state, its latency rings and its metric series go. Before, a role kept
// them for every deployment it ever served (about 50 KiB each, and eight
// metric series per deployment for ever; the refusals by code too).
func TestRouter_DeletedDeploymentForgotten(t *testing.T) {
	e := newEnv(t, envOpts{})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("request: %d %s", resp.StatusCode, body)
	}
	metrics := func() string {
		rec := httptest.NewRecorder()
		e.rt.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}
	// And one refused (its model fails to start): a refusals series.
	e.lc.mu.Lock()
	e.lc.activate = func(context.Context, string) error {
		return structs.Errf(structs.CodeActivationFailed, "the engine did not start")
	}
	e.lc.mu.Unlock()
	e.publish(false)
	resp, err = e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode == http.StatusOK {
		t.Fatalf("a model that fails to start answered: %s", body)
	}
	if !strings.Contains(metrics(), `deployment="demo"`) || e.rt.DeploymentRequests("demo") == nil {
		t.Fatal("no state for demo after its request: the test proves nothing")
	}
	waitFor(t, "demo's refusal counted", func() bool {
		return strings.Contains(metrics(), `capyctl_refusals_total{code="activation_failed",deployment="demo"}`)
	})
	e.lc.mu.Lock()
	e.lc.activate = nil
	e.lc.mu.Unlock()
	// Deleted: the table has it no more.
	e.lc.board.Publish(routes.NewTable())
	waitFor(t, "demo's state forgotten", func() bool {
		return e.rt.DeploymentRequests("demo") == nil && !strings.Contains(metrics(), `deployment="demo"`)
	})
	// Deployed again under the same name: served afresh.
	e.publish(true)
	resp, err = e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("the same name deployed again: %d %s", resp.StatusCode, body)
	}
	if e.rt.DeploymentRequests("demo") == nil {
		t.Fatal("no state for demo deployed again")
	}
}
