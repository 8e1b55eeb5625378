// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

const (
	testToken = "capyadm-test-token"
	testHost  = "127.0.0.1:41000"
	testOrig  = "http://" + testHost
)

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func newTest(now func() time.Time) *Dashboard {
	return New(Options{AdminToken: testToken, TokenEqual: equal, Now: now})
}

// request builds a request to the test listener, as a browser on the
// dashboard's own page sends it unless headers say otherwise.
func request(method, path, body string, headers map[string]string) *http.Request {
	r := httptest.NewRequest(method, "http://"+testHost+path, strings.NewReader(body))
	r.Host = testHost
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

// login logs in and returns the cookie and the CSRF token.
func login(t *testing.T, d *Dashboard) (*http.Cookie, string) {
	t.Helper()
	w := httptest.NewRecorder()
	d.ServeHTTP(w, request(http.MethodPost, "/dashboard/login", `{"token":"`+testToken+`"}`,
		map[string]string{"Content-Type": "application/json", "Origin": testOrig, "Sec-Fetch-Site": "same-origin"}))
	if w.Code != http.StatusOK {
		t.Fatalf("login: %d %s", w.Code, w.Body)
	}
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies", len(cookies))
	}
	var info sessionInfo
	if err := json.Unmarshal(w.Body.Bytes(), &info); err != nil || info.CSRF == "" {
		t.Fatalf("login answer %s: %v", w.Body, err)
	}
	return cookies[0], info.CSRF
}

func errCode(t *testing.T, body []byte) string {
	t.Helper()
	var env struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("error envelope %s: %v", body, err)
	}
	return env.Error.Code
}

func TestDashboard_Login(t *testing.T) {
	d := newTest(nil)
	json := map[string]string{"Content-Type": "application/json", "Origin": testOrig, "Sec-Fetch-Site": "same-origin"}
	with := func(k, v string) map[string]string {
		h := map[string]string{}
		for a, b := range json {
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
		body    string
		headers map[string]string
		status  int
		code    string
	}{
		{"right token", http.MethodPost, `{"token":"` + testToken + `"}`, json, http.StatusOK, ""},
		{"right token with spaces", http.MethodPost, `{"token":" ` + testToken + `\n"}`, json, http.StatusOK, ""},
		{"wrong token", http.MethodPost, `{"token":"capyadm-wrong"}`, json, http.StatusUnauthorized, "unauthorized"},
		{"empty token", http.MethodPost, `{"token":""}`, json, http.StatusUnauthorized, "unauthorized"},
		{"another site's page", http.MethodPost, `{"token":"` + testToken + `"}`, with("Sec-Fetch-Site", "cross-site"), http.StatusForbidden, "cross_site_refused"},
		{"another port of the same host", http.MethodPost, `{"token":"` + testToken + `"}`, with("Origin", "http://127.0.0.1:8080"), http.StatusForbidden, "cross_site_refused"},
		{"no origin at all", http.MethodPost, `{"token":"` + testToken + `"}`, map[string]string{"Content-Type": "application/json"}, http.StatusForbidden, "cross_site_refused"},
		{"a form post", http.MethodPost, `token=` + testToken, with("Content-Type", "application/x-www-form-urlencoded"), http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"GET", http.MethodGet, "", json, http.StatusMethodNotAllowed, "method_not_allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			d.ServeHTTP(w, request(c.method, "/dashboard/login", c.body, c.headers))
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			cookies := w.Result().Cookies()
			if c.status != http.StatusOK {
				if len(cookies) != 0 {
					t.Fatalf("a refused login set a cookie: %v", cookies)
				}
				if got := errCode(t, w.Body.Bytes()); got != c.code {
					t.Fatalf("code %q, want %q", got, c.code)
				}
				return
			}
			if len(cookies) != 1 {
				t.Fatalf("%d cookies", len(cookies))
			}
			ck := cookies[0]
			if ck.Name != "capyctl_dashboard_41000" || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.MaxAge <= 0 {
				t.Fatalf("cookie %+v: want capyctl_dashboard_41000, HttpOnly, SameSite=Strict, Path=/, a Max-Age", ck)
			}
			if strings.Contains(ck.Value, testToken) {
				t.Fatalf("the cookie carries the admin token")
			}
			if !d.sessions.valid(ck.Value) {
				t.Fatalf("the cookie's session does not check")
			}
		})
	}
}

func TestDashboard_Authorize(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := newTest(func() time.Time { return now })
	ck, csrf := login(t, d)
	other := New(Options{AdminToken: "capyadm-other", TokenEqual: equal, Now: func() time.Time { return now }})
	otherCk, _ := login2(t, other)
	tampered := *ck
	tampered.Value = strings.Replace(ck.Value, "v1.", "v1.9", 1)
	page := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": testOrig, HeaderCSRF: csrf}
	without := func(k string) map[string]string {
		h := map[string]string{}
		for a, b := range page {
			if a != k {
				h[a] = b
			}
		}
		return h
	}
	set := func(k, v string) map[string]string {
		h := without(k)
		h[k] = v
		return h
	}
	cases := []struct {
		name    string
		method  string
		cookie  *http.Cookie
		headers map[string]string
		later   time.Duration
		want    string // "", "no_session" or an error code
	}{
		{"the page reads", http.MethodGet, ck, page, 0, ""},
		{"the page acts", http.MethodPost, ck, page, 0, ""},
		{"the page's GET without Origin (browsers send none)", http.MethodGet, ck, without("Origin"), 0, ""},
		{"an older browser without Sec-Fetch-Site", http.MethodPost, ck, without("Sec-Fetch-Site"), 0, ""},
		{"no cookie", http.MethodPost, nil, page, 0, "no_session"},
		{"a tampered cookie", http.MethodPost, &tampered, page, 0, "no_session"},
		{"another role's cookie", http.MethodPost, otherCk, page, 0, "no_session"},
		{"an expired session", http.MethodGet, ck, page, SessionLifetime + time.Second, "no_session"},
		{"another site acts", http.MethodPost, ck, set("Sec-Fetch-Site", "cross-site"), 0, "cross_site_refused"},
		{"another port acts (same site)", http.MethodPost, ck, set("Sec-Fetch-Site", "same-site"), 0, "cross_site_refused"},
		{"another origin reads", http.MethodGet, ck, set("Origin", "http://127.0.0.1:9999"), 0, "cross_site_refused"},
		{"an action typed in the address bar", http.MethodPost, ck, set("Sec-Fetch-Site", "none"), 0, "cross_site_refused"},
		{"an action without the CSRF header", http.MethodPost, ck, without(HeaderCSRF), 0, "cross_site_refused"},
		{"an action with a wrong CSRF header", http.MethodPost, ck, set(HeaderCSRF, "x"+csrf), 0, "cross_site_refused"},
		{"an action saying no origin at all", http.MethodPost, ck, map[string]string{HeaderCSRF: csrf}, 0, "cross_site_refused"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			saved := now
			now = now.Add(c.later)
			defer func() { now = saved }()
			r := request(c.method, "/management/v1/deployments/demo/actions", "", c.headers)
			if c.cookie != nil {
				r.AddCookie(c.cookie)
			}
			err := d.Authorize(r)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "no_session" && !errors.Is(err, ErrNoSession):
				t.Fatalf("got %v, want no session", err)
			case c.want != "" && c.want != "no_session" && (err == nil || string(structs.AsError(err).Code) != c.want):
				t.Fatalf("got %v, want %s", err, c.want)
			}
		})
	}
}

// login2 logs in to another dashboard (another admin token).
func login2(t *testing.T, d *Dashboard) (*http.Cookie, string) {
	t.Helper()
	w := httptest.NewRecorder()
	d.ServeHTTP(w, request(http.MethodPost, "/dashboard/login", `{"token":"capyadm-other"}`,
		map[string]string{"Content-Type": "application/json", "Origin": testOrig}))
	if w.Code != http.StatusOK {
		t.Fatalf("login: %d %s", w.Code, w.Body)
	}
	var info sessionInfo
	_ = json.Unmarshal(w.Body.Bytes(), &info)
	return w.Result().Cookies()[0], info.CSRF
}

func TestDashboard_Assets(t *testing.T) {
	d := newTest(nil)
	cases := []struct {
		path   string
		status int
		ctype  string
	}{
		{"/dashboard/", http.StatusOK, "text/html; charset=utf-8"},
		{"/dashboard/app.js", http.StatusOK, "text/javascript; charset=utf-8"},
		{"/dashboard/app.css", http.StatusOK, "text/css; charset=utf-8"},
		{"/dashboard/icon.svg", http.StatusOK, "image/svg+xml"},
		{"/dashboard", http.StatusMovedPermanently, ""},
		{"/dashboard/nope.js", http.StatusNotFound, "application/json"},
		{"/dashboard/../management/v1/snapshot", http.StatusNotFound, "application/json"},
		{"/dashboard/.hidden", http.StatusNotFound, "application/json"},
		{"/dashboard/session", http.StatusUnauthorized, "application/json"},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			w := httptest.NewRecorder()
			r := request(http.MethodGet, "/", "", nil)
			r.URL.Path = c.path // unclean on purpose
			d.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d", w.Code, c.status)
			}
			if c.ctype != "" && w.Header().Get("Content-Type") != c.ctype {
				t.Fatalf("Content-Type %q, want %q", w.Header().Get("Content-Type"), c.ctype)
			}
			// Every answer carries the policy and the other headers.
			csp := w.Header().Get("Content-Security-Policy")
			if csp != ContentSecurityPolicy || !strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe") {
				t.Fatalf("Content-Security-Policy %q", csp)
			}
			for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"} {
				if w.Header().Get(k) != v {
					t.Fatalf("%s = %q, want %q", k, w.Header().Get(k), v)
				}
			}
		})
	}
}

// TestDashboard_AssetsSelfContained: nothing the page loads comes from
// another origin, and nothing is inline (the policy would block it).
func TestDashboard_AssetsSelfContained(t *testing.T) {
	remote := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	err := fs.WalkDir(assets, "assets", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		data, err := fs.ReadFile(assets, p)
		if err != nil {
			return err
		}
		text := strings.ReplaceAll(string(data), "http://www.w3.org/2000/svg", "") // the SVG namespace, not a fetch
		if m := remote.FindString(text); m != "" {
			t.Errorf("%s names another origin: %s", p, m)
		}
		switch {
		case strings.HasSuffix(p, ".html"):
			for _, bad := range []string{"<style", " style=", "javascript:", " onclick=", " onload=", " onsubmit="} {
				if strings.Contains(strings.ToLower(text), bad) {
					t.Errorf("%s has inline %q", p, bad)
				}
			}
			if regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`).MatchString(text) {
				t.Errorf("%s has an inline script", p)
			}
		case strings.HasSuffix(p, ".js"):
			for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "new Function", "document.write", "localStorage", "sessionStorage"} {
				if strings.Contains(text, bad) {
					t.Errorf("%s uses %s", p, bad)
				}
			}
		}
		if _, ok := contentTypes[pathExt(p)]; !ok {
			t.Errorf("%s has no content type", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func pathExt(p string) string {
	if i := strings.LastIndex(p, "."); i >= 0 {
		return p[i:]
	}
	return ""
}

func TestDashboard_SessionAndLogout(t *testing.T) {
	d := newTest(nil)
	ck, csrf := login(t, d)
	page := map[string]string{"Sec-Fetch-Site": "same-origin", HeaderCSRF: csrf}

	w := httptest.NewRecorder()
	r := request(http.MethodGet, "/dashboard/session", "", page)
	r.AddCookie(ck)
	d.ServeHTTP(w, r)
	var info sessionInfo
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &info) != nil || info.CSRF != csrf {
		t.Fatalf("session: %d %s", w.Code, w.Body)
	}

	// A log out from another site is refused and leaves the cookie.
	w = httptest.NewRecorder()
	r = request(http.MethodPost, "/dashboard/logout", "", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"})
	r.AddCookie(ck)
	d.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || len(w.Result().Cookies()) != 0 {
		t.Fatalf("cross-site logout: %d, cookies %v", w.Code, w.Result().Cookies())
	}

	w = httptest.NewRecorder()
	r = request(http.MethodPost, "/dashboard/logout", "", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": testOrig, HeaderCSRF: csrf})
	r.AddCookie(ck)
	d.ServeHTTP(w, r)
	cookies := w.Result().Cookies()
	if w.Code != http.StatusNoContent || len(cookies) != 1 || cookies[0].MaxAge >= 0 || cookies[0].Value != "" {
		t.Fatalf("logout: %d, cookies %+v", w.Code, cookies)
	}
}
