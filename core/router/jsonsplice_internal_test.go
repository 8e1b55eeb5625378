// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
)

func TestTopLevel(t *testing.T) {
	cases := []struct {
		name string
		in   string
		keys []string
		ok   bool
	}{
		{"compact", `{"id":"a","n":1,"o":{"id":"nested"},"l":[1,{"x":"}"}],"t":true,"z":null}`, []string{"id", "n", "o", "l", "t", "z"}, true},
		{"python separators", "{\"id\": \"a\", \"model\": \"m\" }\n", []string{"id", "model"}, true},
		{"braces and quotes in strings", `{"a":"{\"}[","b":"\\","c":"]}"}`, []string{"a", "b", "c"}, true},
		{"empty", `{}`, nil, true},
		{"array", `[1]`, nil, false},
		{"truncated", `{"id":"a","o":{"x":1}`, nil, false},
		{"trailing garbage", `{"id":"a"} x`, nil, false},
		{"missing comma", `{"a":1 "b":2}`, nil, false},
		{"unterminated string", `{"a":"x}`, nil, false},
		{"missing value", `{"a":}`, nil, false},
		{"escaped key", `{"i\\u0064":"a"}`, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ms, ok := topLevel([]byte(c.in), nil)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			var keys []string
			for _, m := range ms {
				keys = append(keys, string(m.key))
			}
			if c.ok && !reflect.DeepEqual(keys, c.keys) {
				t.Fatalf("keys %q, want %q", keys, c.keys)
			}
		})
	}
}

// TestSpliceJSON: the spliced answer means what the decoded and encoded one
// meant (same members and values), for the shapes engines send.
func TestSpliceJSON(t *testing.T) {
	answers := []string{
		`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"served","choices":[{"index":0,"message":{"role":"assistant","content":"a \"b\" {c}","tool_calls":[{"id":"call","function":{"name":"f","arguments":"{\"id\":1}"}}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
		"{\"id\": \"x\", \"model\": \"served\", \"choices\": [], \"rid\": \"capy-1\", \"timings\": {\"prompt_ms\": 1.5, \"predicted_per_second\": 20}}",
		`{"id":"x","choices":[{"message":{"content":"\u00e9\n"}}]}`,
		// One member: no usage, no timings to read.
		`{"id":"only"}`,
		// Usage first; timings first.
		`{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},"id":"u"}`,
		`{"timings":{"prompt_ms":1.5,"predicted_per_second":20},"id":"t"}`,
	}
	for _, a := range answers {
		q := &request{id: "capy-0123", model: "public<&>", api: structs.APIChat, start: time.Now()}
		q.endAt = q.start
		got, ok := q.spliceJSON([]byte(a))
		if !ok {
			t.Fatalf("not spliced: %s", a)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(a), &m); err != nil {
			t.Fatal(err)
		}
		q2 := &request{id: q.id, model: q.model, api: q.api, start: q.start, endAt: q.endAt}
		want := q2.rebuildJSON(m)
		var g, w map[string]any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("spliced answer is not JSON: %v\n%s", err, got)
		}
		_ = json.Unmarshal(want, &w)
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("spliced\n%s\nwant\n%s", got, want)
		}
		if !reflect.DeepEqual(q.usage, q2.usage) {
			t.Fatalf("usage %+v, want %+v", q.usage, q2.usage)
		}
		if !reflect.DeepEqual(q.timings, q2.timings) {
			t.Fatalf("timings %+v, want %+v", q.timings, q2.timings)
		}
	}
	for _, bad := range []string{`{"object":"chat.completion"}`, `{"id":"x","capyctl":{}}`, `[{"id":"x"}]`} {
		q := &request{id: "capy-1", model: "m", api: structs.APIChat}
		if _, ok := q.spliceJSON([]byte(bad)); ok {
			t.Fatalf("spliced %s", bad)
		}
	}
	// A decision answer without a model is not spliced (the rebuild adds
	// it); one with a model is.
	for a, want := range map[string]bool{`{"id":"x"}`: false, `{"id":"x","model":"served"}`: true} {
		q := &request{id: "capy-1", model: "m", api: structs.APIDecisions}
		if _, ok := q.spliceJSON([]byte(a)); ok != want {
			t.Fatalf("decision answer %s: spliced %v, want %v", a, ok, want)
		}
	}
}

// TestEngineBody_Splice: the spliced engine body means what the decoded
// and encoded one means, for the bodies clients send.
func TestEngineBody_Splice(t *testing.T) {
	bodies := []string{
		`{"model":"pub","messages":[{"role":"user","content":"hi {\"model\":1}"}]}`,
		`{"model":"pub","stream":true,"messages":[]}`,
		`{"model":"pub","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"messages":[]}`,
		`{"model":"pub","stream":false,"stream_options":null,"max_tokens":4}`,
		"{ \"model\" : \"pub\" , \"model\": \"pub\", \"rid\": \"client's\", \"n\": 1 }",
		`{"messages":[],"model":"pub","tools":[{"type":"function","function":{"name":"f","parameters":{"model":"x"}}}]}`,
		`{"mod\u0065l":"pub","messages":[]}`,
	}
	eps := []structs.EngineEndpoint{
		{ServedName: "served"},
		{ServedName: "pub", RequestIDField: "rid"},
		{ServedName: "served", ForwardNonStreamed: true},
	}
	for _, ep := range eps {
		for _, b := range bodies {
			var head chatHead
			_ = parseChatHead([]byte(b), &head)
			q := &request{id: "capy-0123", model: "pub", api: structs.APIChat, body: []byte(b), stream: head.Stream,
				usageOpt: head.StreamOptions != nil && head.StreamOptions.IncludeUsage}
			q.target = &routes.Target{Endpoint: ep}
			got, err := q.engineBody()
			if err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			needModel := ep.ServedName != "" && ep.ServedName != q.model
			needStream := (!q.stream && !ep.ForwardNonStreamed) || (q.stream && !q.usageOpt)
			want, err := q.engineBodyDecoded(needModel, ep.RequestIDField != "", needStream)
			if err != nil {
				t.Fatal(err)
			}
			var g, w map[string]any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatalf("spliced body is not JSON: %v\n%s", err, got)
			}
			_ = json.Unmarshal(want, &w)
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("endpoint %+v, body %s:\nspliced %s\nwant    %s", ep, b, got, want)
			}
		}
	}
}

// TestAppendJSONString: what encoding/json decodes back to the same string
// (invalid UTF-8 to U+FFFD, as encoding/json writes it).
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uo\te`, "line\nfeed\r\ttab\x00\x1f", "é ü 漢字 🙂", "bad \xff\xfe utf8", "a lone \x80 byte", "sep \u2028 \u2029", "<a&b>"} {
		got := appendJSONString(nil, s)
		if !utf8.Valid(got) {
			t.Fatalf("%q -> %q: not UTF-8", s, got)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, got, err)
		}
		var want string
		enc, _ := json.Marshal(s)
		_ = json.Unmarshal(enc, &want)
		if back != want {
			t.Fatalf("%q -> %s -> %q, want %q", s, got, back, want)
		}
	}
}
