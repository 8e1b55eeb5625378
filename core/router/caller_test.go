// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// only allows the listed models.
type only []string

func (o only) Allows(m string) bool {
	for _, x := range o {
		if x == m {
			return true
		}
	}
	return false
}

// meter records what the router does with a request's meter.
type meter struct {
	mu      sync.Mutex
	taken   int
	settled []structs.RequestUsage
	done    chan struct{}
}

func (m *meter) Take() { m.mu.Lock(); m.taken++; m.mu.Unlock() }
func (m *meter) Settle(u structs.RequestUsage) {
	m.mu.Lock()
	m.settled = append(m.settled, u)
	m.mu.Unlock()
	close(m.done)
}

// TestRouter_CallerScope: a model outside the caller's scope is answered
// exactly as one no deployment serves (status and body, the request ID
// aside), and /v1/models lists only the models the scope allows.
func TestRouter_CallerScope(t *testing.T) {
	var scope router.Scope
	e := newEnv(t, envOpts{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(router.WithCaller(r.Context(), router.Caller{Key: "bob", Scope: scope})))
		})
	}})
	answer := func(model string) (int, string) {
		resp, err := e.post(context.Background(), "/v1/chat/completions", strings.Replace(chatBody(false, ""), `"demo"`, `"`+model+`"`, 1), nil)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		return resp.StatusCode, strings.Replace(body, `\"`+model+`\"`, `\"M\"`, 1)
	}
	scope = only{"other"}
	outStatus, outBody := answer("demo")
	unknownStatus, unknownBody := answer("nothing-of-the-kind")
	if outStatus != http.StatusNotFound || outStatus != unknownStatus || outBody != unknownBody || errCode(outBody) != string(structs.CodeUnknownModel) {
		t.Fatalf("out of scope: %d %s\nunknown: %d %s", outStatus, outBody, unknownStatus, unknownBody)
	}
	models := func() []string {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/models", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(readBody(t, resp)), &list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if ids := models(); len(ids) != 0 {
		t.Fatalf("/v1/models lists %v to a key without them", ids)
	}
	scope = only{"demo"}
	if status, body := answer("demo"); status != http.StatusOK {
		t.Fatalf("in scope: %d %s", status, body)
	}
	if ids := models(); len(ids) != 1 || ids[0] != "demo" {
		t.Fatalf("/v1/models lists %v", ids)
	}
}

// TestRouter_CallerMeter: the router takes a request's meter and settles
// it once, after the answer, with the tokens the engine reported in it:
// a whole answer's usage, a stream's usage chunk (asked of the engine
// even when the client did not ask for it), a refusal's code.
func TestRouter_CallerMeter(t *testing.T) {
	var m *meter
	e := newEnv(t, envOpts{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(router.WithCaller(r.Context(), router.Caller{Key: "bob", Meter: m})))
		})
	}})
	cases := []struct {
		name   string
		body   string
		model  string
		code   string
		tokens bool
	}{
		{name: "whole answer", body: chatBody(false, ""), model: "demo", tokens: true},
		{name: "stream without include_usage", body: chatBody(true, ""), model: "demo", tokens: true},
		{name: "stream with include_usage", body: chatBody(true, `,"stream_options":{"include_usage":true}`), model: "demo", tokens: true},
		{name: "unknown model", body: strings.Replace(chatBody(false, ""), `"demo"`, `"nope"`, 1), code: "unknown_model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m = &meter{done: make(chan struct{})}
			resp, err := e.post(context.Background(), "/v1/chat/completions", c.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			within(t, "the meter's settle", m.done)
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.taken != 1 || len(m.settled) != 1 {
				t.Fatalf("taken %d, settled %d", m.taken, len(m.settled))
			}
			u := m.settled[0]
			if u.Model != c.model || u.Code != c.code || u.UsageKnown != c.tokens {
				t.Fatalf("settled %+v", u)
			}
			if !c.tokens {
				return
			}
			// The answer's own usage, equal.
			prompt, completion := usageOf(t, body)
			if u.PromptTokens != prompt || u.CompletionTokens != completion || prompt == 0 || completion == 0 {
				t.Fatalf("settled %d+%d tokens; the answer says %d+%d (%s)", u.PromptTokens, u.CompletionTokens, prompt, completion, body)
			}
		})
	}
}

// usageOf reads the token counts of an answer: the usage member of a whole
// one, the usage chunk of a stream, or, for a stream without one, the
// capyctl metrics comment's input and output tokens.
func usageOf(t *testing.T, body string) (int64, int64) {
	t.Helper()
	type usage struct {
		Prompt     int64 `json:"prompt_tokens"`
		Completion int64 `json:"completion_tokens"`
	}
	var whole struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal([]byte(body), &whole) == nil && whole.Usage != nil {
		return whole.Usage.Prompt, whole.Usage.Completion
	}
	data, comments := sseLines(body)
	for _, d := range data {
		var c struct {
			Usage *usage `json:"usage"`
		}
		if json.Unmarshal([]byte(d), &c) == nil && c.Usage != nil {
			return c.Usage.Prompt, c.Usage.Completion
		}
	}
	for _, c := range comments {
		if i := strings.Index(c, "{"); strings.HasPrefix(c, ": x-capyctl-metrics") && i > 0 {
			var m map[string]struct {
				Value float64 `json:"value"`
			}
			if json.Unmarshal([]byte(c[i:]), &m) == nil {
				return int64(m["input_tokens"].Value), int64(m["output_tokens"].Value)
			}
		}
	}
	t.Fatalf("no usage in %s", body)
	return 0, 0
}
