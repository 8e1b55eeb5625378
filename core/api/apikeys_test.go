// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/usage"
)

// keyRole is a role's key routes and inference API over a real store,
// without deployments.
type keyRole struct {
	st    *store.Store
	keys  *apikeys.Keeper
	meter *usage.Meter
	mgmt  *httptest.Server
	inf   *httptest.Server
}

func newKeyRole(t *testing.T, auth AuthOptions) *keyRole {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	meter, err := usage.Open(st, usage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	backend, err := apikeys.NewStoreBackend(st, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := apikeys.New(apikeys.Config{Backend: backend, Journal: st, Usage: meter, RoleKey: func() string { return testKey }})
	if err != nil {
		t.Fatal(err)
	}
	keys.Start()
	rt := router.New(router.Config{Lifecycle: noLifecycle{}})
	b := &Backend{Store: st, Router: rt, Keys: keys, Usage: meter}
	r := &keyRole{st: st, keys: keys, meter: meter,
		mgmt: httptest.NewServer(NewManagementHandler(b, testToken)),
		inf:  httptest.NewServer(NewInferenceHandler(b, keys, auth))}
	t.Cleanup(func() {
		r.mgmt.Close()
		r.inf.Close()
		rt.Close()
		keys.Close()
		meter.Close()
		st.Close()
	})
	return r
}

func (r *keyRole) mgmtDo(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	status, _, out := do(t, method, r.mgmt.URL+"/management/v1"+path, map[string]string{"Authorization": "Bearer " + testToken}, body)
	return status, out
}

// TestManagement_APIKeys: create (the key once), list and get (never the
// key or its digest), update, revoke, and the refusals.
func TestManagement_APIKeys(t *testing.T) {
	r := newKeyRole(t, AuthOptions{})
	status, body := r.mgmtDo(t, "POST", "/api-keys", `{"name":"bob","models":["demo"],"limits":{"rpm":5},"expires":"720h"}`)
	var created wire.APIKeyCreated
	if status != 201 || json.Unmarshal([]byte(body), &created) != nil || created.Key == "" || created.Name != "bob" ||
		created.Limits.RPM != 5 || created.ExpiresAt.IsZero() || !strings.HasPrefix(created.Key, strings.TrimSuffix(created.Prefix, "…")) {
		t.Fatalf("create: %d %s", status, body)
	}
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"the same name again", "POST", "/api-keys", `{"name":"bob"}`, 409, "api_key_exists"},
		{"a bad name", "POST", "/api-keys", `{"name":"a b"}`, 400, "invalid_request"},
		{"a bad expiry", "POST", "/api-keys", `{"name":"carol","expires":"soon"}`, 400, "invalid_request"},
		{"an unknown field", "POST", "/api-keys", `{"name":"carol","key":"mine"}`, 400, "invalid_request"},
		{"update nobody", "PATCH", "/api-keys/nobody", `{"rpm":1}`, 404, "not_found"},
		{"update nothing", "PATCH", "/api-keys/bob", `{}`, 400, "invalid_request"},
		{"revoke nobody", "DELETE", "/api-keys/nobody", ``, 404, "not_found"},
		{"usage since nonsense", "GET", "/usage?since=yesterday", ``, 400, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := r.mgmtDo(t, c.method, c.path, c.body)
			if status != c.status || !strings.Contains(body, `"code":"`+c.code+`"`) {
				t.Fatalf("%d %s, want %d %s", status, body, c.status, c.code)
			}
		})
	}
	if status, body := r.mgmtDo(t, "PATCH", "/api-keys/bob", `{"models":["chat-*"],"rpm":0,"expires":"never"}`); status != 200 ||
		!strings.Contains(body, `"models":["chat-*"]`) || strings.Contains(body, `"rpm"`) || strings.Contains(body, "expires_at") {
		t.Fatalf("update: %d %s", status, body)
	}
	status, body = r.mgmtDo(t, "GET", "/api-keys", "")
	if status != 200 || !strings.Contains(body, `"name":"bob"`) || !strings.Contains(body, `"name":"default","role":true`) {
		t.Fatalf("list: %d %s", status, body)
	}
	secret := created.Key[len(created.Key)-43:]
	for _, leak := range []string{secret, "sha256:", "digest"} {
		if strings.Contains(body, leak) {
			t.Fatalf("the list shows %q: %s", leak, body)
		}
	}
	if status, _ := r.mgmtDo(t, "DELETE", "/api-keys/bob", ""); status != 200 {
		t.Fatalf("revoke: %d", status)
	}
	if status, _ := r.mgmtDo(t, "GET", "/api-keys/bob", ""); status != 404 {
		t.Fatalf("get after revoke: %d", status)
	}
	// Nothing of the key under the store.
	if evs, _ := r.st.EventsAfter(0, 0); len(evs) < 3 {
		t.Fatalf("events %+v", evs)
	}
	raw, _ := json.Marshal(mustEvents(t, r.st))
	if strings.Contains(string(raw), secret) || strings.Contains(string(raw), "sha256:") {
		t.Fatalf("an event holds the key: %s", raw)
	}
}

func mustEvents(t *testing.T, st *store.Store) []structs.Event {
	t.Helper()
	evs, err := st.EventsAfter(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestInference_KeyLimitsAndUsage: a named key's limits on the inference
// API: the x-ratelimit-* headers on an answer, 429 rate_limited with
// Retry-After past the requests per minute, a revoked key 401 at once,
// and the refusal in the key's usage.
func TestInference_KeyLimitsAndUsage(t *testing.T) {
	r := newKeyRole(t, AuthOptions{})
	plain, _, err := r.keys.Create("bob", apikeys.Spec{Limits: structs.KeyLimits{RPM: 2, TPM: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"Authorization": "Bearer " + plain}
	for i := 0; i < 2; i++ {
		status, h, body := do(t, "GET", r.inf.URL+"/v1/models", hdr, "")
		if status != 200 || h.Get("X-Ratelimit-Limit-Requests") != "2" || h.Get("X-Ratelimit-Limit-Tokens") != "1000" ||
			h.Get("X-Ratelimit-Remaining-Requests") != string(rune('1'-i)) || h.Get("X-Ratelimit-Reset-Requests") == "" {
			t.Fatalf("request %d: %d %v %s", i, status, h, body)
		}
	}
	status, h, body := do(t, "POST", r.inf.URL+"/v1/chat/completions", hdr, `{"model":"demo","messages":[{"role":"user","content":"x"}]}`)
	if status != 429 || h.Get("Retry-After") != "30" || h.Get("X-Ratelimit-Remaining-Requests") != "0" || !strings.Contains(body, `"code":"rate_limited"`) {
		t.Fatalf("the third: %d %v %s", status, h, body)
	}
	// The role's key has no limits: no headers.
	if _, h, _ := do(t, "GET", r.inf.URL+"/v1/models", map[string]string{"Authorization": "Bearer " + testKey}, ""); h.Get("X-Ratelimit-Limit-Requests") != "" {
		t.Fatalf("headers for a key without limits: %v", h)
	}
	rows, err := r.meter.Query(store.UsageFilter{Key: "bob"})
	if err != nil || len(rows) != 1 || rows[0].Errors["rate_limited"] != 1 {
		t.Fatalf("bob's usage %+v, %v", rows, err)
	}
	if err := r.keys.Revoke("bob"); err != nil {
		t.Fatal(err)
	}
	if status, _, _ := do(t, "GET", r.inf.URL+"/v1/models", hdr, ""); status != 401 {
		t.Fatalf("a revoked key: %d", status)
	}
}

// TestInference_FailedAuthenticationBound: past its failed
// authentications per minute, an address is refused 429 rate_limited
// before its key is looked at, the right key too.
func TestInference_FailedAuthenticationBound(t *testing.T) {
	r := newKeyRole(t, AuthOptions{FailuresPerMinute: 3})
	wrong := map[string]string{"Authorization": "Bearer capy-wrong"}
	for i := 0; i < 3; i++ {
		if status, _, _ := do(t, "GET", r.inf.URL+"/v1/models", wrong, ""); status != 401 {
			t.Fatalf("failure %d: %d", i, status)
		}
	}
	status, h, body := do(t, "GET", r.inf.URL+"/v1/models", map[string]string{"Authorization": "Bearer " + testKey}, "")
	if status != 429 || !strings.Contains(body, `"code":"rate_limited"`) || h.Get("Retry-After") == "" {
		t.Fatalf("after 3 failures: %d %v %s", status, h, body)
	}
}

// TestManagement_HostKeepsNoKeys: a host refuses the key routes.
func TestManagement_HostKeepsNoKeys(t *testing.T) {
	srv := httptest.NewServer(NewManagementHandler(&Backend{Role: wire.RoleInfo{Role: "host"}, Keys: apikeys.RoleOnly(testKey)}, testToken))
	defer srv.Close()
	status, _, body := do(t, "GET", srv.URL+"/management/v1/api-keys", map[string]string{"Authorization": "Bearer " + testToken}, "")
	if status != http.StatusNotImplemented || !strings.Contains(body, "unsupported") {
		t.Fatalf("%d %s", status, body)
	}
}
