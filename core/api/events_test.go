// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

const testToken = "capyadm-test"

// eventServer serves the management API of a backend holding only a store:
// the snapshot-free routes (events) work on it.
func eventServer(t *testing.T, opts store.Options) (*store.Store, *client.Client) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewManagementHandler(&Backend{Store: st}, testToken))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		st.Close()
	})
	return st, client.New(srv.URL, testToken)
}

func appendEvents(t *testing.T, st *store.Store, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		if _, err := st.AppendEvent(&structs.Event{Kind: k, Deployment: "demo", Payload: map[string]any{"n": k}}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEvents_ResumeAfterReconnect(t *testing.T) {
	st, cl := eventServer(t, store.Options{})
	appendEvents(t, st, "one", "two")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Without a cursor the stream starts at the present.
	s, err := cl.Events(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, st, "three")
	ev, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != "three" || ev.Seq != 3 || ev.Cursor != st.Cursor(3) || ev.Deployment != "demo" || ev.APIVersion != wire.APIVersion {
		t.Fatalf("first event %+v", ev)
	}
	s.Close()

	// Events appended while disconnected come after a reconnect with the
	// last cursor, in order, and nothing is repeated.
	appendEvents(t, st, "four", "five")
	s, err = cl.Events(ctx, ev.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, want := range []string{"four", "five"} {
		got, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if got.Kind != want {
			t.Fatalf("after reconnect got %s, want %s", got.Kind, want)
		}
	}
	if s.Cursor != st.Cursor(5) {
		t.Fatalf("cursor %s, want %s", s.Cursor, st.Cursor(5))
	}
}

func TestEvents_Heartbeat(t *testing.T) {
	old := HeartbeatInterval
	HeartbeatInterval = 5 * time.Millisecond
	t.Cleanup(func() { HeartbeatInterval = old })
	st, cl := eventServer(t, store.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := cl.Events(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Next returns only after reading the heartbeats that precede the
	// event; append the event once a heartbeat has certainly been sent.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s.Heartbeats == 0 {
			ev, err := s.Next()
			if err != nil || ev.Kind != "tick" {
				t.Errorf("next: %v %v", ev, err)
				return
			}
		}
	}()
	// Keep appending until the reader saw a heartbeat before an event.
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		case <-ctx.Done():
			t.Fatal("no heartbeat")
		case <-time.After(20 * time.Millisecond):
			appendEvents(t, st, "tick")
		}
	}
}

func TestEvents_Cursors(t *testing.T) {
	st, cl := eventServer(t, store.Options{EventMaxCount: 2})
	appendEvents(t, st, "a", "b", "c", "d", "e")
	ctx := context.Background()
	cases := []struct {
		name       string
		cursor     string
		wantCode   structs.Code
		resnapshot bool
	}{
		{"pruned", st.Cursor(1), structs.CodeCursorExpired, true},
		{"another store", "01ARZ3NDEKTSV4RRFFQ69G5FAV:4", structs.CodeCursorExpired, true},
		{"garbage", "not-a-cursor", structs.CodeInvalidCursor, false},
		{"ahead", st.Cursor(99), structs.CodeInvalidCursor, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := cl.Events(ctx, c.cursor)
			var se *structs.Error
			if !asError(err, &se) || se.Code != c.wantCode {
				t.Fatalf("err %v, want %s", err, c.wantCode)
			}
			if got, _ := se.Details[wire.ErrorDetailsResnapshot].(bool); got != c.resnapshot {
				t.Fatalf("resnapshot_required = %v, want %v (%v)", got, c.resnapshot, se.Details)
			}
			if client.IsCursorExpired(err) != (c.wantCode == structs.CodeCursorExpired) {
				t.Fatalf("IsCursorExpired wrong for %v", err)
			}
		})
	}
	// The newest kept events still resume.
	s, err := cl.Events(ctx, st.Cursor(3))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ev, err := s.Next(); err != nil || ev.Kind != "d" {
		t.Fatalf("resume at 3: %v %v", ev, err)
	}
}

func TestManagement_EnvelopeAndAuth(t *testing.T) {
	st, _ := eventServer(t, store.Options{})
	srv := httptest.NewServer(NewManagementHandler(&Backend{Store: st}, testToken))
	defer srv.Close()
	cases := []struct {
		name, method, path, token string
		status                    int
		code                      string
	}{
		{"no token", http.MethodGet, "/events", "", 401, "unauthorized"},
		{"wrong token", http.MethodGet, "/events", "capyadm-wrong", 401, "unauthorized"},
		{"no route", http.MethodGet, "/nope", testToken, 404, "not_found"},
		{"wrong method", http.MethodPatch, "/snapshot", testToken, 405, "method_not_allowed"},
		{"view on a role that routes nothing", http.MethodGet, "/metrics/load", testToken, 501, "unsupported"},
		{"config not published", http.MethodGet, "/config", testToken, 501, "unsupported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, srv.URL+wire.Prefix+c.path, nil)
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			var env wire.ErrorEnvelope
			if err := json.Unmarshal(body, &env); err != nil || env.Error.Code != c.code || env.APIVersion != wire.APIVersion || env.Error.Message == "" {
				t.Fatalf("envelope %s", body)
			}
			if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Fatalf("headers %v", resp.Header)
			}
		})
	}
}
