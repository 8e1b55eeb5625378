// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Session cookie and CSRF header.
const (
	// cookiePrefix begins the session cookie's name; the listener's port
	// ends it. IMPORTANT: cookies are not scoped by port, so two roles on
	// one host would otherwise overwrite each other's session.
	cookiePrefix = "capyctl_dashboard"
	// HeaderCSRF carries the session's CSRF token on every call the page
	// makes with the cookie. A page of another origin cannot send a custom
	// header without a CORS preflight, which this listener never grants.
	HeaderCSRF = "X-CapyCTL-CSRF"
	// SessionLifetime is how long a login lasts.
	SessionLifetime = 7 * 24 * time.Hour
	// sessionVersion tags the cookie's format.
	sessionVersion = "v1"
)

// ErrNoSession says a request carries no valid session cookie: the caller
// falls back to the bearer token's answer (401).
var ErrNoSession = errors.New("no dashboard session")

// sessions issues and checks the stateless session cookie: the expiry and
// an HMAC of it keyed by the admin token. Nothing is kept on the server, so
// a login survives a restart of the role, and rotating the admin token
// ends every session.
type sessions struct {
	key []byte
	now func() time.Time
}

func (s *sessions) mac(parts ...string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(strings.Join(parts, "|")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// issue returns a new session value.
func (s *sessions) issue() (value string, expires time.Time) {
	expires = s.now().Add(SessionLifetime).UTC().Truncate(time.Second)
	exp := strconv.FormatInt(expires.Unix(), 10)
	return sessionVersion + "." + exp + "." + s.mac("session", sessionVersion, exp), expires
}

// valid checks a session value's MAC and expiry.
func (s *sessions) valid(value string) bool {
	parts := strings.Split(value, ".")
	if len(parts) != 3 || parts[0] != sessionVersion {
		return false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || !s.now().Before(time.Unix(exp, 0)) {
		return false
	}
	want := s.mac("session", sessionVersion, parts[1])
	return hmac.Equal([]byte(parts[2]), []byte(want))
}

// csrf returns the CSRF token bound to a session value.
func (s *sessions) csrf(value string) string { return s.mac("csrf", value) }

// cookieName returns the session cookie's name for the listener the
// request reached.
func cookieName(r *http.Request) string {
	if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "" {
		if _, err := strconv.Atoi(port); err == nil {
			return cookiePrefix + "_" + port
		}
	}
	return cookiePrefix
}

// session returns the request's valid session value, or "".
func (s *sessions) session(r *http.Request) string {
	c, err := r.Cookie(cookieName(r))
	if err != nil || !s.valid(c.Value) {
		return ""
	}
	return c.Value
}

// safeMethod reports a method that changes nothing.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin checks that a request carrying the cookie comes from a page of
// this listener's own origin. IMPORTANT: SameSite=Strict is not enough on
// its own: for a browser every port of 127.0.0.1 is the same site, so a
// page served by any other local program on another port would send the
// cookie. Sec-Fetch-Site and Origin tell the origin (scheme, host and
// port) apart.
func sameOrigin(r *http.Request) error {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin":
	case "none":
		// The operator typed the address or followed a bookmark: fine for
		// reading, never for a change.
		if !safeMethod(r.Method) {
			return structs.Errf(structs.CodeCrossSiteRefused, "a change needs a request from the dashboard's own page (Sec-Fetch-Site: none)")
		}
	default:
		return structs.Errf(structs.CodeCrossSiteRefused, "a request from another origin (Sec-Fetch-Site: %s) cannot use the dashboard session", site)
	}
	origin := r.Header.Get("Origin")
	if origin != "" && origin != "http://"+r.Host && origin != "https://"+r.Host {
		return structs.Errf(structs.CodeCrossSiteRefused, "a request from origin %q cannot use the dashboard session of %s", origin, r.Host)
	}
	if !safeMethod(r.Method) && origin == "" && r.Header.Get("Sec-Fetch-Site") == "" {
		return structs.Errf(structs.CodeCrossSiteRefused, "a change with the dashboard session must say its origin (Origin or Sec-Fetch-Site)")
	}
	return nil
}

// Authorize decides whether a management API request may go through on
// the dashboard's session cookie (the bearer token was missing or wrong):
// nil when it may, ErrNoSession when it carries no valid session (answer
// 401 as before), a cross_site_refused error when the session came from
// another origin or a change lacks the session's CSRF token.
func (d *Dashboard) Authorize(r *http.Request) error {
	value := d.sessions.session(r)
	if value == "" {
		return ErrNoSession
	}
	if err := sameOrigin(r); err != nil {
		return err
	}
	// Every call of the page carries the CSRF token; a read without it
	// would be harmless (another origin cannot read the answer), but one
	// rule is easier to check than two.
	if !hmac.Equal([]byte(r.Header.Get(HeaderCSRF)), []byte(d.sessions.csrf(value))) {
		return structs.Errf(structs.CodeCrossSiteRefused, "a call with the dashboard session must carry its %s header", HeaderCSRF)
	}
	return nil
}
