// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/runinfo"
)

// TestRelayHandler_RelayedKey: a host's relay hands its inference API the
// key a server relayed the request for, name and weight (the request log's
// key, the fair line's share), with the host's own credential; a request
// without the server's key header is the host's own key's, and the
// management path carries no key.
func TestRelayHandler_RelayedKey(t *testing.T) {
	creds := &runinfo.Credentials{APIKey: "host-key", AdminToken: "host-admin"}
	type seen struct {
		auth   string
		name   string
		weight int
		ok     bool
	}
	var got seen
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, weight, ok := router.RelayedKeyOf(r.Context())
		got = seen{auth: r.Header.Get("Authorization"), name: name, weight: weight, ok: ok}
	})
	h := relayHandler(record, record, creds)
	send := func(path string, hdr map[string]string) seen {
		t.Helper()
		got = seen{}
		req := httptest.NewRequest(http.MethodPost, path, nil)
		req.Header.Set("Authorization", "Bearer a-client-key")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
		return got
	}
	if s := send("/v1/chat/completions", map[string]string{router.HeaderKeyName: "bob", router.HeaderKeyWeight: "3"}); s != (seen{auth: "Bearer host-key", name: "bob", weight: 3, ok: true}) {
		t.Fatalf("relayed for bob of weight 3: %+v", s)
	}
	if s := send("/v1/chat/completions", nil); s.ok || s.auth != "Bearer host-key" {
		t.Fatalf("relayed without a key: %+v", s)
	}
	if s := send("/management/v1/status", map[string]string{router.HeaderKeyName: "bob"}); s.ok || s.auth != "Bearer host-admin" {
		t.Fatalf("the management path: %+v", s)
	}
}
