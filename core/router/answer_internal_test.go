// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import "testing"

func TestPlainContent(t *testing.T) {
	cases := []struct {
		name, in, want string
		ok             bool
	}{
		{"plain", `{"id":"x","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`, "Hi", true},
		{"escapes", `{"choices":[{"index":0,"delta":{"content":"a\"b\\n\u00e9"}}]}`, "a\"b\\n\u00e9", true},
		{"role and content", `{"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}`, "", false},
		{"finish", `{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}`, "", false},
		{"more keys in delta", `{"choices":[{"delta":{"content":"x","reasoning_content":"y"}}]}`, "", false},
		{"tool call", `{"choices":[{"delta":{"content":"","tool_calls":[]}}]}`, "", false},
		{"usage", `{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":1}}`, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := plainContent([]byte(c.in))
			if ok != c.ok || got != c.want {
				t.Fatalf("plainContent = %q, %v; want %q, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		name, in string
		kind     int
	}{
		{"data", `data: {"id":"x"}`, evData},
		{"done", `data: [DONE]`, evDone},
		{"error object", `data: {"error":{"message":"boom"}}`, evError},
		{"openai error object", `data: {"object":"error","message":"boom"}`, evError},
		{"llama.cpp error line", `error: {"code":400,"message":"too long"}`, evError},
		{"event error", "event: error\ndata: {\"message\":\"x\"}", evError},
		{"comment", `: keep-alive`, evComment},
		{"crlf", "data: {\"a\":1}\r", evData},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if k, _ := classify([]byte(c.in)); k != c.kind {
				t.Fatalf("classify(%q) = %d, want %d", c.in, k, c.kind)
			}
		})
	}
}
