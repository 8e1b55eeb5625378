// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"strings"
	"testing"
)

func TestParseChatHead(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		model   string
		stream  bool
		usage   bool
		msgs    arrayPresence
		wantErr string
	}{
		{"plain", `{"model":"demo","stream":true,"messages":[{"role":"user","content":"x"}]}`, "demo", true, false, 2, ""},
		{"names are exact", `{"Stream":true,"Messages":[1]}`, "", false, false, 0, ""},
		{"model in other letters refused", `{"model":"secret1","Model":"demo"}`, "secret1", false, false, 0, "case-sensitive"},
		{"MODEL alone refused", `{"MODEL":"demo"}`, "", false, false, 0, "case-sensitive"},
		{"stream in capitals", `{"model":"demo","Stream":true}`, "demo", false, false, 0, ""},
		{"include_usage is exact", `{"model":"m","stream_options":{"Include_Usage":true}}`, "m", false, false, 0, ""},
		{"include_usage", `{"model":"m","stream_options":{"include_usage":true}}`, "m", false, true, 0, ""},
		{"escaped name is the name", `{"mod\u0065l":"demo"}`, "demo", false, false, 0, ""},
		{"a repeated model refused", `{"model":"a","model":"b"}`, "a", false, false, 0, "twice"},
		{"nested model is not the model", `{"x":{"model":"no"},"y":["model"],"model":"yes"}`, "yes", false, false, 0, ""},
		{"strings with braces and quotes", `{"a":"}\"{[","model":"m","messages":[]}`, "m", false, false, 1, ""},
		{"whitespace", " {\n\t\"model\" : \"m\" ,\r\n \"stream\" : false } ", "m", false, false, 0, ""},
		{"empty object", `{}`, "", false, false, 0, ""},
		{"model of the wrong type", `{"model":3}`, "", false, false, 0, "model"},
		{"n of the wrong type, model kept", `{"model":"m","n":"2"}`, "m", false, false, 0, "n:"},
		{"not an object", `["model","m"]`, "", false, false, 0, "not a JSON object"},
		{"not JSON", `{"model":"m"`, "", false, false, 0, "unexpected end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h chatHead
			err := parseChatHead([]byte(c.body), &h)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one with %q", err, c.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			usage := h.StreamOptions != nil && h.StreamOptions.IncludeUsage
			if h.Model != c.model || h.Stream != c.stream || usage != c.usage || h.Messages != c.msgs {
				t.Fatalf("head %+v (usage %v), want model %q stream %v usage %v messages %d", h, usage, c.model, c.stream, c.usage, c.msgs)
			}
		})
	}
}

func TestPeekModel(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"d","questions":[]}`: "d",
		`{"models":"d","mode":"x"}`:    "",
	} {
		got, err := peekModel([]byte(body))
		if err != nil || got != want {
			t.Errorf("peekModel(%s) = %q, %v; want %q", body, got, err, want)
		}
	}
	// A model named twice, or in other letters, is refused: a reader that
	// matches names without regard to case would take another model.
	for _, body := range []string{`{"MODEL":"d","questions":[]}`, `{"Model":"d"}`, `{"model":"secret1","Model":"demo"}`,
		`{"Model":"demo","model":"secret1"}`, `{"model":"a","model":"a"}`, `{"mod\u0045l":"d","model":"e"}`} {
		if got, err := RequestModel([]byte(body)); err == nil {
			t.Errorf("RequestModel(%s) = %q, want a refusal", body, got)
		}
	}
}
