// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testLimit bounds every wait in these tests; it is a deadline, never an
// assertion on time.
const testLimit = 10 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testLimit)
	t.Cleanup(cancel)
	return ctx
}

func TestEngineClient_GetJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
			return
		}
		switch r.URL.Path {
		case "/ok":
			_, _ = io.WriteString(w, `{"n":42}`)
		case "/empty":
			w.WriteHeader(http.StatusOK)
		case "/openai-error":
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"message":"model not found","type":"not_found_error","code":404}}`)
		case "/fastapi":
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"detail":[{"loc":["body"],"msg":"field required"}]}`)
		case "/text":
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "Loading model\n")
		case "/garbage":
			_, _ = io.WriteString(w, `{not json`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := NewEngineClient(srv.URL+"/", "Authorization", "Bearer k")
	defer c.CloseIdleConnections()

	cases := []struct {
		name       string
		client     *EngineClient
		path       string
		wantStatus int
		wantN      int
		wantErr    string
	}{
		{name: "ok", client: c, path: "/ok", wantStatus: 200, wantN: 42},
		{name: "path without slash", client: c, path: "ok", wantStatus: 200, wantN: 42},
		{name: "empty body", client: c, path: "/empty", wantStatus: 200},
		{name: "openai error envelope", client: c, path: "/openai-error", wantStatus: 404, wantErr: "engine answered 404 to GET /openai-error: model not found"},
		{name: "fastapi detail", client: c, path: "/fastapi", wantStatus: 422, wantErr: "field required"},
		{name: "plain text", client: c, path: "/text", wantStatus: 503, wantErr: "Loading model"},
		{name: "bad json", client: c, path: "/garbage", wantStatus: 200, wantErr: "decode answer"},
		{name: "wrong key", client: NewEngineClient(srv.URL, "Authorization", "Bearer x"), path: "/ok", wantStatus: 401, wantErr: "Unauthorized"},
		{name: "no auth header", client: NewEngineClient(srv.URL, "", ""), path: "/ok", wantStatus: 401, wantErr: "401"},
	}
	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			var out struct{ N int }
			status, err := cc.client.GetJSON(testContext(t), cc.path, &out)
			if status != cc.wantStatus {
				t.Errorf("status %d, want %d", status, cc.wantStatus)
			}
			if cc.wantErr == "" {
				if err != nil || out.N != cc.wantN {
					t.Errorf("got %+v, %v", out, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), cc.wantErr) {
				t.Errorf("err %v, want it to contain %q", err, cc.wantErr)
			}
			if cc.wantStatus >= 300 && StatusOf(err) != cc.wantStatus {
				t.Errorf("StatusOf = %d", StatusOf(err))
			}
		})
	}
}

func TestEngineClient_PostJSON(t *testing.T) {
	var gotType, gotBody, gotMethod atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotType.Store(r.Header.Get("Content-Type"))
		gotBody.Store(string(b))
		gotMethod.Store(r.Method + " " + r.URL.RequestURI())
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	c := NewEngineClient(srv.URL, "X-Key", "k")
	cases := []struct {
		name     string
		path     string
		body     any
		wantBody string
		wantType string
	}{
		{name: "struct", path: "/abort_request", body: map[string]string{"rid": "r1"}, wantBody: `{"rid":"r1"}`, wantType: "application/json"},
		{name: "raw bytes", path: "/x", body: []byte(`{"a":1}`), wantBody: `{"a":1}`, wantType: "application/json"},
		{name: "raw message", path: "/x", body: json.RawMessage(`[1]`), wantBody: `[1]`, wantType: "application/json"},
		{name: "no body", path: "/sleep?level=1", body: nil, wantBody: "", wantType: ""},
	}
	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			var out struct{ OK bool }
			status, err := c.PostJSON(testContext(t), cc.path, cc.body, &out)
			if err != nil || status != 200 || !out.OK {
				t.Fatalf("PostJSON = %d, %+v, %v", status, out, err)
			}
			if gotBody.Load() != cc.wantBody || gotType.Load() != cc.wantType || gotMethod.Load() != "POST "+cc.path {
				t.Errorf("server saw %v %q type %q", gotMethod.Load(), gotBody.Load(), gotType.Load())
			}
		})
	}
	if _, err := c.PostJSON(testContext(t), "/x", make(chan int), nil); err == nil {
		t.Error("PostJSON encoded a channel")
	}
}

func TestEngineClient_MaxBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `"`+strings.Repeat("x", 200)+`"`)
	}))
	defer srv.Close()
	c := NewEngineClient(srv.URL, "", "")
	c.MaxBody = 100
	if _, err := c.GetJSON(testContext(t), "/", nil); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("err = %v, want a size error", err)
	}
}

func TestEngineClient_WaitHTTP(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	}))
	defer srv.Close()
	c := NewEngineClient(srv.URL, "", "")
	err := c.WaitHTTP(testContext(t), "/health", func(status int, body []byte) bool {
		return status == 200 && strings.Contains(string(body), "ok")
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("%d calls, want 4", n)
	}

	// Not ready before the context ends: the error says what was seen. The
	// context ends once an answer was seen (a short timeout could end it
	// before the first answer on a loaded machine).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = c.WaitHTTP(ctx, "/health", func(status int, _ []byte) bool { cancel(); return status == 299 })
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "last: status 200") {
		t.Errorf("err = %v", err)
	}
}

func TestEngineClient_WaitHTTPRefused(t *testing.T) {
	// A port nobody listens on: every attempt is refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := NewEngineClient("http://"+addr, "", "")
	// The wait ends on its deadline, whatever its last attempt was doing
	// then: the error still names what the attempts saw.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = c.WaitHTTP(ctx, "/health", func(int, []byte) bool {
		t.Error("want called without an answer")
		return true
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("err = %v", err)
	}
}

func TestNextInterval(t *testing.T) {
	cases := []struct {
		name string
		in   time.Duration
		want time.Duration
	}{
		{name: "zero starts fine", in: 0, want: time.Millisecond},
		{name: "grows by a quarter", in: 4 * time.Millisecond, want: 5 * time.Millisecond},
		{name: "keeps growing", in: 100 * time.Millisecond, want: 125 * time.Millisecond},
		{name: "capped", in: 220 * time.Millisecond, want: 250 * time.Millisecond},
		{name: "stays capped", in: 250 * time.Millisecond, want: 250 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := NextInterval(c.in); got != c.want {
				t.Errorf("NextInterval(%v) = %v, want %v", c.in, got, c.want)
			}
		})
	}
	// The first waits are short: the 10th is still under the cap.
	d := time.Duration(0)
	for i := 0; i < 10; i++ {
		d = NextInterval(d)
	}
	if d >= 250*time.Millisecond {
		t.Errorf("10th interval %v already at the cap", d)
	}
}

func TestPoll(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name    string
		cond    func(n int) (bool, error)
		wantErr error
		wantN   int
	}{
		{name: "at once", cond: func(int) (bool, error) { return true, nil }, wantN: 1},
		{name: "third time", cond: func(n int) (bool, error) { return n == 3, nil }, wantN: 3},
		{name: "error stops", cond: func(n int) (bool, error) { return false, boom }, wantErr: boom, wantN: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			err := Poll(testContext(t), func(context.Context) (bool, error) {
				n++
				return c.cond(n)
			})
			if !errors.Is(err, c.wantErr) || n != c.wantN {
				t.Errorf("Poll = %v after %d calls; want %v after %d", err, n, c.wantErr, c.wantN)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Poll(ctx, func(context.Context) (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Poll on a cancelled context = %v", err)
	}
}

func TestEngineMessage(t *testing.T) {
	cases := []struct {
		name string
		body string
		want string
	}{
		{name: "openai", body: `{"error":{"message":"bad","type":"x"}}`, want: "bad"},
		{name: "string error", body: `{"error":"Unauthorized"}`, want: "Unauthorized"},
		{name: "message", body: `{"message":"Cache not flushed","status":"error"}`, want: "Cache not flushed"},
		{name: "fastapi string", body: `{"detail":"Not Found"}`, want: "Not Found"},
		{name: "fastapi list", body: `{"detail":[{"msg":"value error"}]}`, want: "value error"},
		{name: "text", body: "  Internal Server Error\n", want: "Internal Server Error"},
		{name: "empty", body: "", want: ""},
		{name: "long", body: strings.Repeat("y", 600), want: strings.Repeat("y", 512) + "..."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := EngineMessage([]byte(c.body)); got != c.want {
				t.Errorf("EngineMessage = %q, want %q", got, c.want)
			}
		})
	}
}
