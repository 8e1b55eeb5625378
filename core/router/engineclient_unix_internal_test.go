// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/sdk/engineapi"
)

// TestParseEngineURL reads loopback ports and Unix sockets.
func TestParseEngineURL(t *testing.T) {
	cases := []struct {
		name, base, path string
		want             engineTarget
		unix             string
	}{
		{"port", "http://127.0.0.1:8000", "/v1/chat/completions", engineTarget{addr: "127.0.0.1:8000", path: "/v1/chat/completions"}, ""},
		{"port and prefix", "http://127.0.0.1:8000/api", "/v1/chat/completions", engineTarget{addr: "127.0.0.1:8000", path: "/api/v1/chat/completions"}, ""},
		{"socket", engineapi.UnixBaseURL("/state/launches/chat/0-L1/engine.sock"), "/v1/chat/completions",
			engineTarget{addr: "%2Fstate%2Flaunches%2Fchat%2F0-L1%2Fengine.sock", path: "/v1/chat/completions"}, "/state/launches/chat/0-L1/engine.sock"},
		{"network namespace", "http+netns://4242.977.netns.invalid:30001", "/v1/chat/completions",
			engineTarget{addr: "4242.977.netns.invalid:30001", path: "/v1/chat/completions"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseEngineURL(c.base, c.path)
			if err != nil || got != c.want {
				t.Fatalf("parseEngineURL = %+v, %v; want %+v", got, err, c.want)
			}
			sock, ok := unixSocketAddr(got.addr)
			if ok != (c.unix != "") || sock != c.unix {
				t.Fatalf("unixSocketAddr = %q, %v; want %q", sock, ok, c.unix)
			}
		})
	}
	if _, err := parseEngineURL(engineapi.UnixScheme+"relative.sock", "/x"); err == nil {
		t.Fatal("a relative socket path was accepted")
	}
	if _, err := parseEngineURL(engineapi.NetnsScheme+"127.0.0.1:8000", "/x"); err == nil {
		t.Fatal("a namespaced address without the engine's identity was accepted")
	}
	if ns, ok := engineapi.ParseNetnsHost("4242.977.netns.invalid:30001"); !ok || ns.Engine.PID != 4242 || ns.Engine.StartTicks != 977 || ns.Port != 30001 {
		t.Fatalf("ParseNetnsHost = %+v, %v", ns, ok)
	}
	if _, ok := engineapi.ParseNetnsHost("127.0.0.1:8000"); ok {
		t.Fatal("a loopback port read as a namespaced engine")
	}
}

// TestEngineClient_UnixSocket sends two requests to an engine on a Unix
// socket: both are answered (the Host header is valid for Go's server) and
// the second reuses the pooled connection.
func TestEngineClient_UnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "capy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "engine.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"path":"`+r.URL.Path+`"}`)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	cl := newEngineClient(4)
	defer cl.closeIdle()
	target, err := parseEngineURL(engineapi.UnixBaseURL(sock), "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		call, err := cl.do(context.Background(), target, nil, []byte(`{}`), time.Now().Add(30*time.Second), &cutter{})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(call.Resp.Body)
		if err != nil || call.Resp.StatusCode != http.StatusOK || string(body) != `{"path":"/v1/chat/completions"}` {
			t.Fatalf("request %d: %d %s %v", i, call.Resp.StatusCode, body, err)
		}
		call.finish(true)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for two requests, want the pooled one reused", n)
	}
}
