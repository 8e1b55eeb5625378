// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/fleet/fsm"
)

// relayClient posts to a server's inference handler.
func relayClient(t *testing.T, s *Server) func(ctx context.Context, body string) (*http.Response, error) {
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 0, 0))
	t.Cleanup(srv.Close)
	return func(ctx context.Context, body string) (*http.Response, error) {
		// Bounded: a relay that never answers fails the test, saying
		// so, instead of holding it until the package's timeout.
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer key")
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}
}

// TestRelay_PicksTheLeastBusyHost: a request goes to the replica's host
// with the fewest requests in flight; among equals the hosts take turns.
func TestRelay_PicksTheLeastBusyHost(t *testing.T) {
	s := testServer(t, ServerOptions{})
	locals := map[string]*fakeLocal{"gpu-a": newFakeLocal(), "gpu-b": newFakeLocal()}
	for name, l := range locals {
		joinHost(t, s, name, l)
		waitReady(t, s, name)
	}
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "demo", Routes: []string{"demo"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}, {Host: "gpu-b", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	post := relayClient(t, s)
	answer := func() {
		t.Helper()
		resp, err := post(context.Background(), `{"model":"demo","messages":[]}`)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("relayed answer: %d %s", resp.StatusCode, b)
		}
	}
	answered := func() (a, b int64) { return locals["gpu-a"].answered.Load(), locals["gpu-b"].answered.Load() }

	// Equals take turns.
	for range 4 {
		answer()
	}
	if a, b := answered(); a != 2 || b != 2 {
		t.Fatalf("4 requests to two idle hosts: %d and %d answered, want 2 each", a, b)
	}

	// A stream held open on one host: the requests go to the other.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(ctx, `{"model":"demo","stream":true}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	busy := "gpu-a"
	select {
	case <-locals["gpu-b"].started:
		busy = "gpu-b"
	case <-locals["gpu-a"].started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream started on no host")
	}
	a0, b0 := answered()
	for range 4 {
		answer()
	}
	a, b := answered()
	if busy == "gpu-a" && (a != a0 || b != b0+4) || busy == "gpu-b" && (b != b0 || a != a0+4) {
		t.Fatalf("with a stream on %s, the other answered %d and %d more, want 0 and 4", busy, a-a0, b-b0)
	}
}

// TestRelay_NoHostInReachSaysWhenToRetry: a request for a deployment none
// of whose hosts is connected is refused 503 host_unreachable, with a
// Retry-After of two heartbeats and a second (the time a host takes to be
// seen back).
func TestRelay_NoHostInReachSaysWhenToRetry(t *testing.T) {
	s := testServer(t, ServerOptions{Heartbeat: 5 * time.Second})
	if err := s.apply(fsm.HostJoined{Host: "gpu-x"}); err != nil {
		t.Fatal(err)
	}
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "demo", Routes: []string{"demo"},
		Hosts: []HostShare{{Host: "gpu-x", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := relayClient(t, s)(context.Background(), `{"model":"demo","messages":[]}`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "host_unreachable") || resp.Header.Get("Retry-After") != "11" {
		t.Fatalf("got %d (Retry-After %q) %s, want 503 host_unreachable, Retry-After 11", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
}

// TestRelay_ContentType: a relayed body keeps the client's Content-Type,
// and is sent as JSON where the client named none.
func TestRelay_ContentType(t *testing.T) {
	s := testServer(t, ServerOptions{})
	local := newFakeLocal()
	joinHost(t, s, "gpu-a", local)
	waitReady(t, s, "gpu-a")
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "demo", Routes: []string{"demo"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 0, 0))
	defer srv.Close()
	for _, ct := range []string{"application/json; charset=utf-8", ""} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"demo","messages":[]}`))
		req.Header.Set("Authorization", "Bearer key")
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("Content-Type %q: %d %s", ct, resp.StatusCode, b)
		}
	}
	local.mu.Lock()
	got := append([]string(nil), local.types...)
	local.mu.Unlock()
	if want := []string{"application/json; charset=utf-8", "application/json"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the host saw Content-Type %q, want %q", got, want)
	}
}
