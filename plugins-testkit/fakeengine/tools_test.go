// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

const fakeTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}]`

// freshConn sends each request on a connection of its own: the fake
// llama-server, as b4748, closes its connection after a streamed answer
// while advertising keep-alive, so a pooled connection may be dead.
var freshConn = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func postChat(t *testing.T, url, body string) string {
	t.Helper()
	resp, err := freshConn.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	return string(b)
}

// TestTools_Calls: a request whose tools the last user message names gets
// a function call, streamed as the engines stream one (the id, type and
// name first, then the arguments in pieces, finish_reason tool_calls) or
// whole (tool_calls beside "content": null); tool_choice none and a
// message naming no tool get text; after the tool's result the answer is
// text that starts with it.
func TestTools_Calls(t *testing.T) {
	for _, fl := range []fakeengine.Flavour{fakeengine.NewVLLM(fakeengine.VLLMOptions{}), fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{}), fakeengine.OpenAI{}} {
		t.Run(fl.Name(), func(t *testing.T) {
			e := startEngine(t, fakeengine.Config{Flavour: fl}, true)
			user := `"messages":[{"role":"user","content":"weather in Paris? get_weather"}]`
			stream := postChat(t, e.url, `{"model":"m","stream":true,`+fakeTools+`,`+user+`}`)
			var calls []map[string]any
			finish := ""
			for _, l := range strings.Split(stream, "\n") {
				data, ok := strings.CutPrefix(l, "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						Delta struct {
							Content   string           `json:"content"`
							ToolCalls []map[string]any `json:"tool_calls"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					t.Fatal(err)
				}
				for _, ch := range c.Choices {
					if ch.Delta.Content != "" {
						t.Fatalf("text beside a call: %s", stream)
					}
					calls = append(calls, ch.Delta.ToolCalls...)
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
			}
			if len(calls) < 2 || finish != "tool_calls" {
				t.Fatalf("no streamed call (finish %q): %s", finish, stream)
			}
			first := calls[0]
			fn := first["function"].(map[string]any)
			if first["id"] == nil || first["type"] != "function" || fn["name"] != "get_weather" || fn["arguments"] != "" {
				t.Fatalf("the call's first chunk: %v", first)
			}
			args := ""
			for _, c := range calls[1:] {
				if c["id"] != nil || c["function"].(map[string]any)["name"] != nil {
					t.Fatalf("a later chunk repeats the call's id or name: %v", c)
				}
				args += c["function"].(map[string]any)["arguments"].(string)
			}
			if args != `{"city":"weather in Paris? get_weather","days":1}` {
				t.Fatalf("arguments %s", args)
			}

			whole := postChat(t, e.url, `{"model":"m",`+fakeTools+`,`+user+`}`)
			if !strings.Contains(whole, `"content":null`) || !strings.Contains(whole, `"tool_calls":[{"id":`) || !strings.Contains(whole, `"finish_reason":"tool_calls"`) {
				t.Fatalf("whole: %s", whole)
			}
			for _, body := range []string{
				`{"model":"m","tool_choice":"none",` + fakeTools + `,` + user + `}`,
				`{"model":"m",` + fakeTools + `,"messages":[{"role":"user","content":"hello"}]}`,
			} {
				if out := postChat(t, e.url, body); strings.Contains(out, "tool_calls") {
					t.Fatalf("a call where none was due: %s", out)
				}
			}
			if out := postChat(t, e.url, `{"model":"m","tool_choice":"required",`+fakeTools+`,"messages":[{"role":"user","content":"hello"}]}`); !strings.Contains(out, `"tool_calls"`) {
				t.Fatalf("tool_choice required without a call: %s", out)
			}
			after := postChat(t, e.url, `{"model":"m",`+fakeTools+`,"messages":[{"role":"user","content":"get_weather"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`)
			if !strings.Contains(after, `"content":"Tool result: sunny.`) {
				t.Fatalf("after the result: %s", after)
			}
		})
	}
}
