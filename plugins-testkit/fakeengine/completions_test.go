// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestEngine_Completions: every chat flavour answers POST /v1/completions
// in OpenAI's text_completion shape (whole, and streamed with the usage
// chunk on request), with the text a chat request for the same prompt gets,
// and the flavour's request ID.
func TestEngine_Completions(t *testing.T) {
	cases := []struct {
		name    string
		flavour fakeengine.Flavour
		ridBody string            // a request ID member of the body
		header  map[string]string // request headers
		wantID  string            // the answer's id
	}{
		{name: "openai", flavour: fakeengine.OpenAI{}, header: map[string]string{"X-Request-Id": "r1"}, wantID: "cmpl-r1"},
		{name: "vllm", flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{}), header: map[string]string{"X-Request-Id": "r1"}, wantID: "cmpl-r1"},
		{name: "sglang", flavour: fakeengine.NewSGLang(fakeengine.SGLangOptions{}), ridBody: `,"rid":"r1"`, wantID: "cmpl-r1"},
		{name: "llamacpp", flavour: fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{})},
		{name: "tensorfold", flavour: fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{})},
	}
	type completion struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Index        int     `json:"index"`
			Text         string  `json:"text"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			te := startEngine(t, fakeengine.Config{Flavour: c.flavour, Tokens: 4}, true)
			hdr := map[string]string{"Content-Type": "application/json"}
			for k, v := range c.header {
				hdr[k] = v
			}
			status, data, _ := do(t, http.MethodPost, te.url+"/v1/chat/completions", chatBody("m", "tell a story", nil), hdr)
			if status != 200 {
				t.Fatalf("chat: %d %s", status, data)
			}
			var chat struct {
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}
			_ = json.Unmarshal(data, &chat)

			// Whole.
			status, data, _ = do(t, http.MethodPost, te.url+"/v1/completions", `{"model":"m","prompt":"tell a story"`+c.ridBody+`}`, hdr)
			if status != 200 {
				t.Fatalf("completions: %d %s", status, data)
			}
			var out completion
			if err := json.Unmarshal(data, &out); err != nil {
				t.Fatal(err)
			}
			if out.Object != "text_completion" || len(out.Choices) != 1 || out.Choices[0].FinishReason == nil || *out.Choices[0].FinishReason != "stop" ||
				out.Usage == nil || out.Usage.CompletionTokens != 4 || !strings.HasPrefix(out.ID, "cmpl-") || (c.wantID != "" && out.ID != c.wantID) {
				t.Fatalf("answer: %s", data)
			}
			if len(chat.Choices) != 1 || out.Choices[0].Text != chat.Choices[0].Message.Content {
				t.Fatalf("text %q, chat's %s", out.Choices[0].Text, data)
			}

			// Streamed, with the usage chunk.
			status, data, _ = do(t, http.MethodPost, te.url+"/v1/completions",
				`{"model":"m","prompt":"tell a story","stream":true,"stream_options":{"include_usage":true}`+c.ridBody+`}`, hdr)
			if status != 200 {
				t.Fatalf("stream: %d %s", status, data)
			}
			events := sseEvents(t, data)
			if len(events) < 3 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream: %s", data)
			}
			var text string
			var usage bool
			for _, ev := range events[:len(events)-1] {
				var ch completion
				if err := json.Unmarshal([]byte(ev), &ch); err != nil {
					t.Fatalf("%v: %s", err, ev)
				}
				if ch.Object != "text_completion" || (c.wantID != "" && ch.ID != c.wantID) {
					t.Fatalf("chunk: %s", ev)
				}
				for _, choice := range ch.Choices {
					text += choice.Text
				}
				usage = usage || (ch.Usage != nil && ch.Usage.CompletionTokens == 4)
			}
			if text != out.Choices[0].Text || !usage {
				t.Fatalf("streamed text %q (usage %v), want %q: %s", text, usage, out.Choices[0].Text, data)
			}

			// A prompt is required.
			status, data, _ = do(t, http.MethodPost, te.url+"/v1/completions", `{"model":"m"}`, hdr)
			if status < 400 {
				t.Fatalf("no prompt: %d %s", status, data)
			}
		})
	}
}
