// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDashboard_Playground: the playground's calls need the session and
// its CSRF token; they reach the inference handler as a client's request
// (its own path, the key chosen by name or pasted, none of the session's
// cookie or headers); /keys names the keys and never their secrets.
func TestDashboard_Playground(t *testing.T) {
	const secret = "capy-the-role-key"
	var seen *http.Request
	var seenBody string
	inference := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		b, _ := io.ReadAll(r.Body)
		seenBody = string(b)
		if _, ok := w.(http.Hijacker); ok {
			t.Error("the playground handed the inference API a connection it could take over")
		}
		w.Header().Set("X-CapyCTL-Request-Id", "capy-1")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	d := New(Options{AdminToken: testToken, TokenEqual: equal, Inference: inference,
		Keys: func() []Key { return []Key{{Name: "default", Description: "the role's key", Secret: secret}} }})
	cookie, csrf := login(t, d)
	page := func(extra map[string]string) map[string]string {
		h := map[string]string{"Origin": testOrig, "Sec-Fetch-Site": "same-origin", HeaderCSRF: csrf, "Content-Type": "application/json"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	call := func(method, path string, headers map[string]string, withCookie bool) *httptest.ResponseRecorder {
		seen = nil
		r := request(method, path, `{"model":"demo","stream":true}`, headers)
		if withCookie {
			r.AddCookie(cookie)
		}
		w := httptest.NewRecorder()
		d.ServeHTTP(w, r)
		return w
	}
	const chat = "/dashboard/playground/v1/chat/completions"

	w := call(http.MethodGet, "/dashboard/playground/keys", page(nil), true)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"name":"default"`) || strings.Contains(w.Body.String(), secret) {
		t.Fatalf("keys: %d %s", w.Code, w.Body)
	}
	w = call(http.MethodPost, chat, page(map[string]string{HeaderKeyName: "default"}), true)
	if w.Code != 200 || seen == nil || w.Header().Get("X-CapyCTL-Request-Id") != "capy-1" {
		t.Fatalf("chat by key name: %d %s", w.Code, w.Body)
	}
	if seen.URL.Path != "/v1/chat/completions" || seen.Header.Get("Authorization") != "Bearer "+secret || seenBody != `{"model":"demo","stream":true}` {
		t.Fatalf("the inference API saw %s %q, body %q", seen.URL.Path, seen.Header.Get("Authorization"), seenBody)
	}
	for _, h := range []string{"Cookie", HeaderCSRF, HeaderKeyName, "Origin"} {
		if seen.Header.Get(h) != "" {
			t.Errorf("the inference API saw the session's %s header", h)
		}
	}
	w = call(http.MethodPost, chat, page(map[string]string{HeaderKey: "capy-pasted"}), true)
	if w.Code != 200 || seen.Header.Get("Authorization") != "Bearer capy-pasted" {
		t.Fatalf("chat with a pasted key: %d, the inference API saw %q", w.Code, seen.Header.Get("Authorization"))
	}

	refusals := []struct {
		name       string
		method     string
		path       string
		headers    map[string]string
		withCookie bool
		status     int
		code       string
	}{
		{"no session", http.MethodPost, chat, page(map[string]string{HeaderKeyName: "default"}), false, 401, "unauthorized"},
		{"no CSRF token", http.MethodPost, chat, map[string]string{"Origin": testOrig, "Sec-Fetch-Site": "same-origin", HeaderKeyName: "default"}, true, 403, "cross_site_refused"},
		{"another origin", http.MethodPost, chat, page(map[string]string{"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "cross-site", HeaderKeyName: "default"}), true, 403, "cross_site_refused"},
		{"no key chosen", http.MethodPost, chat, page(nil), true, 400, "invalid_request"},
		{"an unknown key name", http.MethodPost, chat, page(map[string]string{HeaderKeyName: "other"}), true, 404, "not_found"},
		{"a route the playground does not offer", http.MethodPost, "/dashboard/playground/v1/embeddings", page(map[string]string{HeaderKeyName: "default"}), true, 404, "not_found"},
		{"another method", http.MethodGet, chat, page(map[string]string{HeaderKeyName: "default"}), true, 405, "method_not_allowed"},
	}
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			w := call(c.method, c.path, c.headers, c.withCookie)
			if w.Code != c.status || errCode(t, w.Body.Bytes()) != c.code || seen != nil {
				t.Fatalf("%d %s (the inference API was called: %v); want %d %s", w.Code, w.Body, seen != nil, c.status, c.code)
			}
		})
	}
}
