// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package dashboard serves the role's web dashboard on the management
// listener: one page, its script and style embedded in the binary, and the
// login that trades the admin token for a session cookie. The page reads
// and changes nothing itself: it calls the management API (snapshot,
// events, views, actions), which accepts the session cookie for calls from
// the page's own origin (Authorize).
//
// Safe by default: the assets come from this binary only and are served
// under a Content-Security-Policy that allows nothing else (no inline
// script or style, no other origin); the cookie is HttpOnly and
// SameSite=Strict; a call with the cookie must come from the same origin
// and carry the session's CSRF token.
package dashboard

import (
	"embed"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// Prefix is the dashboard's path on the management listener.
const Prefix = "/dashboard/"

// ContentSecurityPolicy is sent with every dashboard answer. IMPORTANT: no
// 'unsafe-inline' and no other origin: the page's script and style are the
// embedded files, and the charts are SVG drawn by that script.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// contentTypes are the assets' types, fixed here rather than read from the
// host's MIME tables (which may call a script application/x-javascript).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".txt":  "text/plain; charset=utf-8",
}

// maxLoginBody bounds the login request.
const maxLoginBody = 4096

//go:embed assets
var assets embed.FS

// Options configure a Dashboard.
type Options struct {
	// AdminToken is the management API's token; the login compares with it
	// and the session cookie is signed with it.
	AdminToken string
	// TokenEqual compares a presented token with AdminToken in constant
	// time.
	TokenEqual func(got, want string) bool
	Logger     hclog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Inference is the role's inference API handler, which the
	// playground's requests are handed to (nil: no playground).
	Inference http.Handler
	// Keys are the inference keys the playground may use by name: the
	// role's API key today ("default").
	Keys func() []Key
}

// Dashboard is the dashboard's handler (mount it at Prefix) and the
// session check the management API calls (Authorize).
type Dashboard struct {
	o        Options
	sessions sessions
	files    fs.FS
}

// New returns the dashboard.
func New(o Options) *Dashboard {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	return &Dashboard{o: o, sessions: sessions{key: []byte("capyctl-dashboard\x00" + o.AdminToken), now: o.Now}, files: sub}
}

// ServeHTTP implements http.Handler for every path under Prefix.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	rest := strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(Prefix, "/"))
	switch rest {
	case "":
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
	case "/login":
		d.login(w, r)
	case "/logout":
		d.logout(w, r)
	case "/session":
		d.session(w, r)
	case "/":
		d.asset(w, r, "index.html")
	default:
		if p, ok := strings.CutPrefix(rest, playgroundPrefix); ok && strings.HasPrefix(p, "/") {
			d.playground(w, r, p)
			return
		}
		d.asset(w, r, strings.TrimPrefix(rest, "/"))
	}
}

// asset serves one embedded file.
func (d *Dashboard) asset(w http.ResponseWriter, r *http.Request, name string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	name = path.Clean(name)
	if !fs.ValidPath(name) || strings.HasPrefix(name, ".") {
		writeError(w, structs.Errf(structs.CodeNotFound, "no dashboard file %s", r.URL.Path))
		return
	}
	data, err := fs.ReadFile(d.files, name)
	if err != nil {
		writeError(w, structs.Errf(structs.CodeNotFound, "no dashboard file %s", r.URL.Path))
		return
	}
	ct, ok := contentTypes[path.Ext(name)]
	if !ok {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(data)
}

// loginRequest is the login's body.
type loginRequest struct {
	Token string `json:"token"`
}

// sessionInfo answers a login and GET /dashboard/session.
type sessionInfo struct {
	APIVersion string    `json:"api_version"`
	CSRF       string    `json:"csrf"`
	Expires    time.Time `json:"expires"`
}

// login trades the admin token for the session cookie. The body is JSON,
// which a form of another site cannot send without a preflight.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, structs.Errf(structs.CodeMethodNotAllowed, "log in with POST %slogin", Prefix))
		return
	}
	if err := sameOrigin(r); err != nil {
		writeError(w, err)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" && !strings.HasPrefix(ct, "application/json;") {
		writeError(w, structs.Errf(structs.CodeUnsupportedMediaType, "send Content-Type: application/json, not %q", ct))
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxLoginBody+1))
	if err != nil || len(data) > maxLoginBody {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the login body does not read (at most %d bytes)", maxLoginBody))
		return
	}
	var req loginRequest
	if err := json.Unmarshal(data, &req); err != nil {
		writeError(w, structs.Errf(structs.CodeInvalidRequest, "the login body does not parse: %v", err))
		return
	}
	if d.o.TokenEqual == nil || !d.o.TokenEqual(strings.TrimSpace(req.Token), d.o.AdminToken) {
		d.o.Logger.Info("dashboard login refused", "remote", r.RemoteAddr)
		writeError(w, structs.Errf(structs.CodeUnauthorized, "wrong admin token"))
		return
	}
	value, expires := d.sessions.issue()
	http.SetCookie(w, &http.Cookie{
		Name: cookieName(r), Value: value, Path: "/", Expires: expires, MaxAge: int(SessionLifetime / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	d.o.Logger.Info("dashboard login", "remote", r.RemoteAddr, "expires", expires)
	writeJSON(w, http.StatusOK, sessionInfo{APIVersion: wire.APIVersion, CSRF: d.sessions.csrf(value), Expires: expires})
}

// logout clears the cookie. The session value itself stays valid until it
// expires (nothing is kept on the server): rotate the admin token to end
// every session at once.
func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, structs.Errf(structs.CodeMethodNotAllowed, "log out with POST %slogout", Prefix))
		return
	}
	if err := d.Authorize(r); err != nil && err != ErrNoSession {
		writeError(w, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName(r), Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.WriteHeader(http.StatusNoContent)
}

// session answers the page's question "am I logged in?" with the session's
// CSRF token, or 401.
func (d *Dashboard) session(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	value := d.sessions.session(r)
	if value == "" {
		writeError(w, structs.Errf(structs.CodeUnauthorized, "not logged in: post the admin token to %slogin", Prefix))
		return
	}
	if err := sameOrigin(r); err != nil {
		writeError(w, err)
		return
	}
	exp, _ := expiry(value)
	writeJSON(w, http.StatusOK, sessionInfo{APIVersion: wire.APIVersion, CSRF: d.sessions.csrf(value), Expires: exp})
}

// expiry reads a session value's expiry (checked values only).
func expiry(value string) (time.Time, bool) {
	parts := strings.Split(value, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0).UTC(), true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes the management API's error envelope.
func writeError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	info := e.Info()
	writeJSON(w, wire.HTTPStatus(e.Code), wire.ErrorEnvelope{APIVersion: wire.APIVersion,
		Error: wire.ErrorBody{Code: string(e.Code), Message: e.Message, Retryable: info.Retryable, Details: e.Details}})
}
