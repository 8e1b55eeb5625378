// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// saltEngine answers every chat request with a small completion and keeps
// the bodies it was sent.
type saltEngine struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (s *saltEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	data, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(data, &body)
	s.mu.Lock()
	s.bodies = append(s.bodies, body)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

func (s *saltEngine) last() (map[string]any, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bodies) == 0 {
		return nil, 0
	}
	return s.bodies[len(s.bodies)-1], len(s.bodies)
}

func TestRouter_CacheSaltReachesTheEngineAsADigest(t *testing.T) {
	for _, supported := range []bool{true, false} {
		eng := &saltEngine{}
		srv := httptest.NewServer(eng)
		t.Cleanup(srv.Close)
		e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) {
			ep.BaseURL, ep.CacheSalt = srv.URL, supported
		}})
		send := func(body string) (int, string) {
			resp, err := e.post(context.Background(), "/v1/chat/completions", body, nil)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(data)
		}
		withSalt := `{"model":"demo","cache_salt":"tenant-a","messages":[{"role":"user","content":"hi"}]}`
		if !supported {
			status, body := send(withSalt)
			if status != http.StatusBadRequest || !strings.Contains(body, string(structs.CodeCacheSaltUnsupported)) {
				t.Fatalf("a salt for an engine without cache_salt: %d %s", status, body)
			}
			if _, n := eng.last(); n != 0 {
				t.Fatalf("the engine got %d requests, want none", n)
			}
			continue
		}
		if status, body := send(withSalt); status != http.StatusOK {
			t.Fatalf("salted request: %d %s", status, body)
		}
		got, _ := eng.last()
		want := router.CacheSaltDigest("demo", 0, "tenant-a")
		if got["cache_salt"] != want || strings.Contains(want, "tenant-a") || len(want) != 64 {
			t.Fatalf("the engine got cache_salt %v, want the digest %s", got["cache_salt"], want)
		}
		if router.CacheSaltDigest("other", 0, "tenant-a") == want || router.CacheSaltDigest("demo", 1, "tenant-a") == want {
			t.Fatal("the digest does not depend on the deployment and its revision")
		}
		if status, _ := send(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`); status != http.StatusOK {
			t.Fatalf("unsalted request: %d", status)
		}
		if got, _ := eng.last(); got["cache_salt"] != nil {
			t.Fatalf("an unsalted request reached the engine with cache_salt %v", got["cache_salt"])
		}
		_, before := eng.last()
		for _, bad := range []string{`""`, `"` + strings.Repeat("s", 1025) + `"`, `7`} {
			status, body := send(`{"model":"demo","cache_salt":` + bad + `,"messages":[]}`)
			if status != http.StatusBadRequest || !strings.Contains(body, "invalid_request") {
				t.Fatalf("cache_salt %.20s: %d %s", bad, status, body)
			}
		}
		if _, n := eng.last(); n != before {
			t.Fatal("a refused salt reached the engine")
		}
	}
}
