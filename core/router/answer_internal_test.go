// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

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
		{"llama.cpp", `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"H"}}],"created":1795971179,"id":"chatcmpl-sQuD","model":"gpt-3.5-turbo","system_fingerprint":"b4748-c392e5094","object":"chat.completion.chunk"}`, "H", true},
		{"vLLM", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}`, " the", true},
		{"a newline", `{"choices":[{"delta":{"content":"a\nb"}}]}`, "a\nb", true},
		{"index 1", `{"choices":[{"index":1,"delta":{"content":"x"}}]}`, "", false},
		{"two choices", `{"choices":[{"index":0,"delta":{"content":"x"}},{"index":0,"delta":{"content":"y"}}]}`, "", false},
		{"log probabilities", `{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[]}}]}`, "", false},
		{"usage null", `{"choices":[{"delta":{"content":"x"}}],"usage":null}`, "", false},
		{"timings", `{"choices":[{"delta":{"content":"x"}}],"timings":{"prompt_n":1}}`, "", false},
		{"content null", `{"choices":[{"delta":{"content":null}}]}`, "", false},
		{"a control character", "{\"choices\":[{\"delta\":{\"content\":\"a\x01\"}}]}", "", false},
		{"not JSON", `{"choices":[{"delta":{"content":"x"}}`, "", false},
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

// FuzzPlainContent holds plainContent to what decoding the chunk finds, on
// every chunk it reads.
func FuzzPlainContent(f *testing.F) {
	f.Add([]byte(`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"H"}}],"id":"x"}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"content":"a\u00e9\n"},"logprobs":null}]}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		text, ok := plainContent(p)
		// Invalid UTF-8 is kept as sent (the halves of a character split
		// over two chunks join up); decoding replaces it.
		if !ok || !json.Valid(p) || !exactNames(p) || !utf8.ValidString(text) {
			return
		}
		var c chunkHead
		if err := decodeChunk(p, &c); err != nil {
			t.Fatalf("%s: plainContent read %q, decoding fails: %v", p, text, err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Index != 0 || c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content != text ||
			c.Choices[0].Delta.Role != "" || len(c.Choices[0].FinishReason) > 0 && string(c.Choices[0].FinishReason) != "null" || len(c.Usage) > 0 || len(c.Timings) > 0 {
			t.Fatalf("%s: plainContent read %q, decoding finds %+v", p, text, c)
		}
	})
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
