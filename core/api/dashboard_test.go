// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/api/dashboard"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/store"
)

// dashboardServer serves the management API of a backend holding only a
// store, and logs a cookie jar in to its dashboard.
func dashboardServer(t *testing.T) (srv *httptest.Server, hc *http.Client, csrf string) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv = httptest.NewServer(NewManagementHandler(&Backend{Store: st}, testToken))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		st.Close()
	})
	jar, _ := cookiejar.New(nil)
	hc = &http.Client{Jar: jar}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/dashboard/login", strings.NewReader(`{"token":"`+testToken+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		CSRF string `json:"csrf"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&info) != nil {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	u, _ := url.Parse(srv.URL)
	if len(jar.Cookies(u)) != 1 {
		t.Fatalf("login left %d cookies", len(jar.Cookies(u)))
	}
	return srv, hc, info.CSRF
}

// TestManagementHandler_DashboardSession: the management API takes the
// dashboard's session cookie for calls from the dashboard's own origin
// with the session's CSRF token, and refuses it from anywhere else; the
// bearer token works as before.
func TestManagementHandler_DashboardSession(t *testing.T) {
	srv, hc, csrf := dashboardServer(t)
	page := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": srv.URL, dashboard.HeaderCSRF: csrf}
	set := func(k, v string) map[string]string {
		h := map[string]string{}
		for a, b := range page {
			h[a] = b
		}
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	cases := []struct {
		name    string
		method  string
		path    string
		body    string
		headers map[string]string
		jar     bool
		status  int
		code    string
	}{
		{"the page reads the hosts", http.MethodGet, "/management/v1/hosts", "", page, true, http.StatusOK, ""},
		// A store-only backend has no router: the metrics answer
		// unsupported, but past the auth (status 0: neither 401 nor 403).
		{"the page reads the metrics", http.MethodGet, "/metrics", "", page, true, 0, ""},
		{"the bearer token as before", http.MethodGet, "/management/v1/hosts", "", map[string]string{"Authorization": "Bearer " + testToken}, false, http.StatusOK, ""},
		{"no cookie, no token", http.MethodGet, "/management/v1/hosts", "", page, false, http.StatusUnauthorized, "unauthorized"},
		{"the cookie without the CSRF header", http.MethodGet, "/management/v1/hosts", "", set(dashboard.HeaderCSRF, ""), true, http.StatusForbidden, "cross_site_refused"},
		{"a cross-site action", http.MethodPost, "/management/v1/deployments/demo/actions", `{"action":"stop"}`,
			set("Sec-Fetch-Site", "cross-site"), true, http.StatusForbidden, "cross_site_refused"},
		{"an action from another origin", http.MethodPost, "/management/v1/deployments/demo/instances/0/actions", `{"action":"park"}`,
			set("Origin", "http://127.0.0.1:1"), true, http.StatusForbidden, "cross_site_refused"},
		{"a cross-site action with a stolen CSRF token still has no cookie", http.MethodPost, "/management/v1/deployments/demo/actions", `{"action":"stop"}`,
			set("Sec-Fetch-Site", "cross-site"), false, http.StatusUnauthorized, "unauthorized"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, v := range c.headers {
				req.Header.Set(k, v)
			}
			client := http.DefaultClient
			if c.jar {
				client = hc
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if c.status == 0 {
				if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
					t.Fatalf("refused: %d %s", resp.StatusCode, body)
				}
				return
			}
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if c.code != "" && !strings.Contains(string(body), `"code":"`+c.code+`"`) {
				t.Fatalf("answer %s, want code %s", body, c.code)
			}
		})
	}
}

// TestManagementHandler_ServesDashboard: the page and its assets are on the
// management listener, with the policy, and without the token.
func TestManagementHandler_ServesDashboard(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := NewManagementHandler(&Backend{Store: st}, testToken)
	for path, ctype := range map[string]string{
		"/dashboard/": "text/html; charset=utf-8", "/dashboard/app.js": "text/javascript; charset=utf-8", "/dashboard/app.css": "text/css; charset=utf-8",
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != ctype || w.Header().Get("Content-Security-Policy") != dashboard.ContentSecurityPolicy {
			t.Fatalf("%s: %d %q %q", path, w.Code, w.Header().Get("Content-Type"), w.Header().Get("Content-Security-Policy"))
		}
	}
}

// TestInferenceHandler_NoDashboard: the inference listener serves no part
// of the dashboard, with the API key or without.
func TestInferenceHandler_NoDashboard(t *testing.T) {
	h := NewInferenceHandler(&Backend{}, apikeys.RoleOnly("capy-key"), AuthOptions{})
	for _, c := range []struct{ method, path, key string }{
		{http.MethodGet, "/dashboard/", ""},
		{http.MethodGet, "/dashboard/", "capy-key"},
		{http.MethodGet, "/dashboard/app.js", "capy-key"},
		{http.MethodPost, "/dashboard/login", "capy-key"},
	} {
		r := httptest.NewRequest(c.method, c.path, strings.NewReader(`{"token":"`+testToken+`"}`))
		r.Header.Set("Content-Type", "application/json")
		if c.key != "" {
			r.Header.Set("Authorization", "Bearer "+c.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusNotFound && w.Code != http.StatusUnauthorized {
			t.Fatalf("%s %s (key %q): %d", c.method, c.path, c.key, w.Code)
		}
		if len(w.Result().Cookies()) != 0 || w.Header().Get("Content-Security-Policy") != "" || strings.Contains(w.Body.String(), "<html") {
			t.Fatalf("%s %s: the inference listener answered like the dashboard", c.method, c.path)
		}
	}
}
