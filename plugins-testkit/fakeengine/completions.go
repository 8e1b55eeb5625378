// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The text completions API (POST /v1/completions), as vLLM, SGLang and
// llama-server serve it: OpenAI's legacy completions, answered by the same
// generation as a chat request. A whole answer is
//
//	{"id":"cmpl-…","object":"text_completion","created":…,"model":…,
//	 "choices":[{"index":0,"text":…,"logprobs":null,"finish_reason":"stop"}],
//	 "usage":{…}}
//
// and a stream is chunks of the same object with each choice's "text" a
// piece, the last piece with the finish reason, then (on
// stream_options.include_usage) a chunk with no choices and the usage, then
// data: [DONE] (vLLM's CompletionStreamResponse, SGLang's, llama-server's
// oaicompat completion).

// CompletionsHandler serves POST /v1/completions: it checks the request
// (a "prompt" is required; the flavour's PrepareChat checks the model and
// takes the request ID), then answers like ChatHandler, in the
// text_completion shape. A client that goes away stops it at once.
func (e *Engine) CompletionsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.serveGen(w, r, true) })
}

// DecodeCompletion parses and checks a text completion body into a
// ChatRequest whose one user message is the prompt (a string, or the
// strings of a list joined by spaces). Errors are *APIError.
func DecodeCompletion(body []byte) (*ChatRequest, error) {
	if !json.Valid(body) {
		return nil, &APIError{Kind: KindInvalidJSON, Message: "request body is not valid JSON"}
	}
	var in struct {
		Model         string          `json:"model"`
		Prompt        json.RawMessage `json:"prompt"`
		Stream        bool            `json:"stream"`
		StreamOptions *StreamOptions  `json:"stream_options,omitempty"`
		MaxTokens     *int            `json:"max_tokens,omitempty"`
		CacheSalt     string          `json:"cache_salt,omitempty"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, &APIError{Kind: KindInvalidRequest, Message: fmt.Sprintf("invalid request: %v", err)}
	}
	req := &ChatRequest{Model: in.Model, Stream: in.Stream, StreamOptions: in.StreamOptions, MaxTokens: in.MaxTokens, CacheSalt: in.CacheSalt}
	if err := json.Unmarshal(body, &req.Raw); err != nil {
		return nil, &APIError{Kind: KindInvalidRequest, Message: "request body must be a JSON object"}
	}
	prompt, ok := promptText(in.Prompt)
	if !ok {
		return nil, &APIError{Kind: KindInvalidRequest, Message: "prompt must be a string or a non-empty list of strings"}
	}
	content, _ := json.Marshal(prompt)
	req.Messages = []Message{{Role: "user", Content: content}}
	if in.MaxTokens != nil && *in.MaxTokens < 1 {
		return nil, &APIError{Kind: KindInvalidRequest, Message: "max_tokens must be at least 1"}
	}
	return req, nil
}

// promptText reads a prompt: a string, or a list of strings joined by
// spaces.
func promptText(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, len(raw) > 0 && raw[0] == '"'
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil && len(list) > 0 {
		return strings.Join(list, " "), true
	}
	return "", false
}

// idPrefix is the prefix of an answer's id: "cmpl-" for a text completion
// (vLLM's and SGLang's), "chatcmpl-" for a chat one.
func idPrefix(completions bool) string {
	if completions {
		return "cmpl-"
	}
	return "chatcmpl-"
}

// TextCompletion is a text_completion body, whole or one streamed chunk.
type TextCompletion struct {
	// ID is "cmpl-…", the same on every chunk.
	ID string `json:"id"`
	// Object is "text_completion".
	Object string `json:"object"`
	// Created is a Unix time.
	Created int64 `json:"created"`
	// Model is the answering model's name.
	Model string `json:"model"`
	// Choices holds one choice, or none in the usage chunk.
	Choices []TextChoice `json:"choices"`
	// Usage counts tokens: on the whole answer, and on the usage chunk.
	Usage *Usage `json:"usage,omitempty"`
}

// TextChoice is a choice of a text completion.
type TextChoice struct {
	// Index is 0.
	Index int `json:"index"`
	// Text is the answer, or a piece of it.
	Text string `json:"text"`
	// Logprobs is null.
	Logprobs any `json:"logprobs"`
	// FinishReason is null until the end.
	FinishReason any `json:"finish_reason"`
}

// CompletionResponse is the text_completion of a finished answer.
func CompletionResponse(res *ChatResult) TextCompletion {
	return TextCompletion{
		ID: res.ID, Object: "text_completion", Created: res.Created, Model: res.Model,
		Choices: []TextChoice{{Text: res.Text, FinishReason: res.FinishReason}},
		Usage:   UsageOf(res),
	}
}

// CompletionStream encodes a streamed text completion.
type CompletionStream struct {
	// Meta is what every chunk repeats.
	Meta ChatMeta
	// UsageChunk sends a usage chunk before [DONE].
	UsageChunk bool
}

func (s *CompletionStream) chunk(choices []TextChoice, usage *Usage) TextCompletion {
	return TextCompletion{ID: s.Meta.ID, Object: "text_completion", Created: s.Meta.Created, Model: s.Meta.Model, Choices: choices, Usage: usage}
}

// Open sends nothing: a text completion has no role chunk.
func (s *CompletionStream) Open() []byte { return nil }

// Token sends one piece of text.
func (s *CompletionStream) Token(text string) []byte {
	return SSEData(s.chunk([]TextChoice{{Text: text}}, nil))
}

// Close sends the finish chunk, the usage chunk if asked, and [DONE].
func (s *CompletionStream) Close(res *ChatResult) []byte {
	out := SSEData(s.chunk([]TextChoice{{FinishReason: res.FinishReason}}, nil))
	if s.UsageChunk {
		out = append(out, SSEData(s.chunk([]TextChoice{}, UsageOf(res)))...)
	}
	return append(out, SSEDone...)
}
