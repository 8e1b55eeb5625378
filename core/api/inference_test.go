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
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

type noLifecycle struct{}

func (noLifecycle) Activate(context.Context, string) error { return nil }

// inferenceServer is the inference API over an empty router and a
// responses store.
func inferenceServer(t *testing.T) (*httptest.Server, *responses.Store) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rs := responses.Open(st, responses.Options{})
	rt := router.New(router.Config{Lifecycle: noLifecycle{}, Responses: rs})
	srv := httptest.NewServer(NewInferenceHandler(&Backend{Router: rt, Responses: rs}, apikeys.RoleOnly(testKey), AuthOptions{}))
	t.Cleanup(func() {
		srv.Close()
		rt.Close()
		rs.Close()
		st.Close()
	})
	return srv, rs
}

func do(t *testing.T, method, url string, hdr map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestInference_KeysAndShapes: the key in Authorization: Bearer or in
// x-api-key (Anthropic's); a refusal in Anthropic's shape on the Messages
// routes, CapyCTL's elsewhere.
func TestInference_KeysAndShapes(t *testing.T) {
	srv, _ := inferenceServer(t)
	msg := `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`
	cases := []struct {
		name, method, path string
		hdr                map[string]string
		status             int
		want               string
	}{
		{"messages with x-api-key", "POST", "/v1/messages", map[string]string{"x-api-key": testKey, "anthropic-version": "2023-06-01"}, 404, `{"type":"error","error":{"type":"not_found_error"`},
		{"messages with a bearer", "POST", "/v1/messages", map[string]string{"Authorization": "Bearer " + testKey}, 404, `"code":"unknown_model"`},
		{"messages with a wrong key", "POST", "/v1/messages", map[string]string{"x-api-key": "nope"}, 401, `{"type":"error","error":{"type":"authentication_error"`},
		{"count_tokens without a key", "POST", "/v1/messages/count_tokens", nil, 401, `"type":"authentication_error"`},
		{"messages: no such route", "POST", "/v1/messages/batches", map[string]string{"x-api-key": testKey}, 404, `{"type":"error","error":{"type":"not_found_error"`},
		{"messages: GET", "GET", "/v1/messages", map[string]string{"x-api-key": testKey}, 405, `"type":"invalid_request_error"`},
		{"chat with x-api-key", "POST", "/v1/chat/completions", map[string]string{"x-api-key": testKey}, 404, `{"error":{"code":"unknown_model"`},
		{"chat with a wrong key", "POST", "/v1/chat/completions", map[string]string{"x-api-key": "nope"}, 401, `{"error":{"code":"unauthorized"`},
		{"responses with a wrong key", "POST", "/v1/responses", map[string]string{"Authorization": "Bearer nope"}, 401, `{"error":{"code":"unauthorized"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := msg
			if strings.Contains(c.path, "chat") {
				body = `{"model":"nope","messages":[{"role":"user","content":"x"}]}`
			}
			status, h, got := do(t, c.method, srv.URL+c.path, c.hdr, body)
			if status != c.status || !strings.Contains(got, c.want) || h.Get(router.HeaderRequestID) == "" {
				t.Fatalf("%d %s (request id %q), want %d %s", status, got, h.Get(router.HeaderRequestID), c.status, c.want)
			}
			if status == 401 && h.Get("WWW-Authenticate") == "" {
				t.Fatal("a 401 without WWW-Authenticate")
			}
		})
	}
}

// TestInference_StoredResponses: GET, input_items and DELETE of a stored
// response, for the key that created it only.
func TestInference_StoredResponses(t *testing.T) {
	srv, rs := inferenceServer(t)
	now := time.Now()
	rs.Put(structs.StoredResponse{ID: "resp_mine", Owner: router.DefaultKeyName, CreatedAt: now,
		Input: json.RawMessage(`[{"role":"user","content":"hi"}]`), Response: json.RawMessage(`{"id":"resp_mine","object":"response","output":[]}`)})
	rs.Put(structs.StoredResponse{ID: "resp_theirs", Owner: "another-key", CreatedAt: now,
		Input: json.RawMessage(`[]`), Response: json.RawMessage(`{"id":"resp_theirs"}`)})
	key := map[string]string{"Authorization": "Bearer " + testKey}
	if status, _, body := do(t, "GET", srv.URL+"/v1/responses/resp_mine", key, ""); status != 200 || !strings.HasPrefix(body, `{"id":"resp_mine"`) {
		t.Fatalf("get: %d %s", status, body)
	}
	if status, _, body := do(t, "GET", srv.URL+"/v1/responses/resp_mine/input_items", key, ""); status != 200 || !strings.Contains(body, `"data":[{"role":"user","content":"hi"}]`) {
		t.Fatalf("input items: %d %s", status, body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if status, _, body := do(t, m, srv.URL+"/v1/responses/resp_theirs", key, ""); status != 404 || !strings.Contains(body, "response_not_found") {
			t.Fatalf("%s of another key's response: %d %s", m, status, body)
		}
	}
	if status, _, body := do(t, "DELETE", srv.URL+"/v1/responses/resp_mine", key, ""); status != 200 || !strings.Contains(body, `"deleted":true`) {
		t.Fatalf("delete: %d %s", status, body)
	}
	if status, _, _ := do(t, "GET", srv.URL+"/v1/responses/resp_mine", key, ""); status != 404 {
		t.Fatalf("get after delete: %d", status)
	}
	if status, _, _ := do(t, "GET", srv.URL+"/v1/responses/resp_mine", nil, ""); status != 401 {
		t.Fatalf("get without a key: %d", status)
	}
}

// TestRequestsView_Routes: the management API's request log view (the
// dashboard's requests panel) names each request's route, newest first,
// and the dashboard asks for it and shows the route.
func TestRequestsView_Routes(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := store.NewRequestWriter(st, store.DefaultRequestWriterOptions())
	at := time.Now().UTC()
	for i, api := range []string{"chat", "responses", "messages", "count_tokens"} {
		w.Record(structs.RequestRecord{ID: "capy-" + api, Deployment: "demo", API: api, Outcome: "completed", Status: 200,
			ReceivedAt: at.Add(time.Duration(i) * time.Second), TotalMs: 1})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewManagementHandler(&Backend{Store: st}, testToken))
	defer srv.Close()
	auth := map[string]string{"Authorization": "Bearer " + testToken}
	status, _, body := do(t, "GET", srv.URL+"/management/v1/requests?limit=3", auth, "")
	var out struct {
		Requests []struct {
			ID, Route string
		} `json:"requests"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("%d %s", status, body)
	}
	var routes []string
	for _, r := range out.Requests {
		routes = append(routes, r.Route)
	}
	if strings.Join(routes, ",") != "count_tokens,messages,responses" {
		t.Fatalf("routes %v: %s", routes, body)
	}
	if status, _, _ := do(t, "GET", srv.URL+"/management/v1/requests?limit=0", auth, ""); status != 400 {
		t.Fatalf("limit 0: %d", status)
	}
	_, _, js := do(t, "GET", srv.URL+"/dashboard/app.js", nil, "")
	if !strings.Contains(js, "API + '/requests?limit='") || !strings.Contains(js, "r.route") {
		t.Fatal("the dashboard does not list the requests' routes")
	}
}
