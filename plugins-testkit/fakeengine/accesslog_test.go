// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestAccessLog_OneLinePerRequest: the generic engine logs every request
// it answers with uvicorn's access line (as vLLM and SGLang do by default),
// streamed or not, refused or not; the fake's own /fake/stats is not
// logged.
func TestAccessLog_OneLinePerRequest(t *testing.T) {
	te := startEngine(t, fakeengine.Config{APIKey: "k"}, true)
	auth := map[string]string{"Authorization": "Bearer k"}
	do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hello", nil), auth)
	do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hello", map[string]any{"stream": true}), auth)
	do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hello", nil), nil)
	do(t, "GET", te.url+"/health", "", nil)
	do(t, "GET", te.url+"/fake/stats", "", nil)
	var got []string
	for _, l := range strings.Split(te.stdout.String(), "\n") {
		if strings.HasPrefix(l, "INFO:     127.0.0.1:") {
			got = append(got, l[strings.Index(l, " - ")+3:])
		}
	}
	want := []string{
		`"POST /v1/chat/completions HTTP/1.1" 200 OK`,
		`"POST /v1/chat/completions HTTP/1.1" 200 OK`,
		`"POST /v1/chat/completions HTTP/1.1" 401 Unauthorized`,
		`"GET /health HTTP/1.1" 200 OK`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("access lines:\n%s\nwant:\n%s\nstdout:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), te.stdout.String())
	}
	if strings.Contains(te.stdout.String(), "hello") {
		t.Fatal("the prompt is in the log")
	}
}

// TestAccessLog_LlamaServerLines: the llama.cpp flavour logs a generation
// as llama-server b4748 does (13 lines: the slot's start, its release and
// timings, the request line) and any other request with its request line.
func TestAccessLog_LlamaServerLines(t *testing.T) {
	te := startEngine(t, fakeengine.Config{Flavour: fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{})}, true)
	do(t, "POST", te.url+"/v1/chat/completions", chatBody("m", "hello", nil), nil)
	do(t, "GET", te.url+"/health", "", nil)
	out := te.stdout.String()
	start := strings.Index(out, "srv  params_from_")
	if start < 0 {
		t.Fatalf("no generation logged:\n%s", out)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out[start:]), "\n") {
		got = append(got, strings.Fields(l)[1])
	}
	want := "params_from_: launch_slot_: update_slots: update_slots: update_slots: update_slots: release: print_timing: eval time time update_slots: log_server_r: log_server_r:"
	if strings.Join(got, " ") != want {
		t.Fatalf("lines %q, want %q:\n%s", strings.Join(got, " "), want, out)
	}
	for _, w := range []string{"request: POST /v1/chat/completions 127.0.0.1 200", "request: GET /health 127.0.0.1 200"} {
		if !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s", w, out)
		}
	}
}
