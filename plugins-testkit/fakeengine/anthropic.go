// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Anthropic's Messages API as vLLM serves it (vllm/entrypoints/anthropic/
// api_router.py and serving.py): the request is converted to a chat
// completion (system first, tool results as tool messages, tool uses as
// tool calls, thinking dropped) and answered by the chat generation; the
// stream is message_start (the prompt's tokens in its usage),
// content_block_start/delta/stop per block, message_delta with the stop
// reason and the usage, message_stop. vLLM sends no ping. Errors are
// Anthropic's envelope {"type":"error","error":{"type","message"}}.

// anthropicRequest is the part of a Messages request the fake reads.
type anthropicRequest struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
	ToolChoice *struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tool_choice"`
	Stream bool `json:"stream"`
}

type anthropicBlockIn struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// writeAnthropicError writes Anthropic's error envelope.
func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	WriteJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

// decodeAnthropic converts a Messages request to the chat request the
// generation runs, as vLLM's _convert_anthropic_to_openai_request does.
func decodeAnthropic(body []byte, needMax bool) (*ChatRequest, error) {
	var a anthropicRequest
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, err
	}
	if len(a.Messages) == 0 {
		return nil, fmt.Errorf("messages: field required")
	}
	if needMax && a.MaxTokens == nil {
		return nil, fmt.Errorf("max_tokens: field required")
	}
	req := &ChatRequest{Model: a.Model, Stream: a.Stream, MaxTokens: a.MaxTokens, Raw: map[string]json.RawMessage{}}
	text := func(raw json.RawMessage) string {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
		var blocks []anthropicBlockIn
		_ = json.Unmarshal(raw, &blocks)
		var parts []string
		for _, b := range blocks {
			if b.Type == "text" {
				parts = append(parts, b.Text)
			}
		}
		return strings.Join(parts, "")
	}
	if len(a.System) > 0 && string(a.System) != "null" {
		req.Messages = append(req.Messages, Message{Role: "system", Content: jsonString(text(a.System))})
	}
	for _, m := range a.Messages {
		var blocks []anthropicBlockIn
		if json.Unmarshal(m.Content, &blocks) != nil {
			req.Messages = append(req.Messages, Message{Role: m.Role, Content: m.Content})
			continue
		}
		var texts []string
		for _, b := range blocks {
			switch b.Type {
			case "text":
				texts = append(texts, b.Text)
			case "tool_result":
				req.Messages = append(req.Messages, Message{Role: "tool", Content: jsonString(text(b.Content))})
			}
		}
		if len(texts) > 0 || m.Role == "assistant" {
			req.Messages = append(req.Messages, Message{Role: m.Role, Content: jsonString(strings.Join(texts, ""))})
		}
	}
	if len(a.Tools) > 0 {
		tools := make([]map[string]any, 0, len(a.Tools))
		for _, t := range a.Tools {
			tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": t.Name, "description": t.Description, "parameters": t.InputSchema}})
		}
		req.Raw["tools"], _ = json.Marshal(tools)
		choice := any("auto")
		if tc := a.ToolChoice; tc != nil {
			switch tc.Type {
			case "any":
				choice = "required"
			case "none":
				choice = "none"
			case "tool":
				choice = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
			}
		}
		req.Raw["tool_choice"], _ = json.Marshal(choice)
	}
	return req, nil
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// prepareNative checks a native route's request against the served model
// and names it by X-Request-Id; false when it answered.
func (e *Engine) prepareNative(w http.ResponseWriter, r *http.Request, req *ChatRequest, notFound func(msg string)) bool {
	if req.Model != e.ServedName() {
		notFound(fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return false
	}
	req.ID = r.Header.Get("X-Request-Id")
	if req.ID == "" {
		req.ID = NewRequestID()
	}
	req.ResponseModel = req.Model
	return true
}

// AnthropicMessagesHandler serves POST /v1/messages.
func (e *Engine) AnthropicMessagesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := e.readBody(w, r)
		if !ok {
			return
		}
		req, err := decodeAnthropic(body, true)
		if err != nil {
			writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		if !e.prepareNative(w, r, req, func(msg string) { writeAnthropicError(w, http.StatusNotFound, "not_found_error", msg) }) {
			return
		}
		prompt := countPromptTokens(req.Messages)
		e.generate(w, r, req, &answerEncoders{
			idPrefix: "chatcmpl-",
			stream: func(req *ChatRequest, meta ChatMeta) ChatStream {
				return &anthropicStream{meta: meta, prompt: prompt, block: -1}
			},
			whole: anthropicWhole,
		})
	})
}

// AnthropicCountTokensHandler serves POST /v1/messages/count_tokens: the
// prompt's tokens as a generation counts them.
func (e *Engine) AnthropicCountTokensHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := e.readBody(w, r)
		if !ok {
			return
		}
		req, err := decodeAnthropic(body, false)
		if err != nil {
			writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		if !e.prepareNative(w, r, req, func(msg string) { writeAnthropicError(w, http.StatusNotFound, "not_found_error", msg) }) {
			return
		}
		WriteJSON(w, http.StatusOK, map[string]int{"input_tokens": countPromptTokens(req.Messages)})
	})
}

// anthropicStopReason is a chat finish reason in Anthropic's words.
func anthropicStopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls":
		return "tool_use"
	}
	return "end_turn"
}

// anthropicWhole is a finished Messages answer.
func anthropicWhole(res *ChatResult) any {
	content := []map[string]any{}
	if tc := res.ToolCall; tc != nil {
		content = append(content, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": json.RawMessage(tc.Arguments)})
	} else {
		content = append(content, map[string]any{"type": "text", "text": res.Text})
	}
	return map[string]any{
		"id": res.ID, "type": "message", "role": "assistant", "content": content, "model": res.Model,
		"stop_reason": anthropicStopReason(res.FinishReason), "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": res.PromptTokens, "output_tokens": res.CompletionTokens},
	}
}

// anthropicStream encodes a Messages stream as vLLM's
// message_stream_converter does.
type anthropicStream struct {
	meta   ChatMeta
	prompt int
	block  int    // the open block's index, -1 for none
	kind   string // the open block's type
	next   int
}

func anthropicEvent(name string, v any) []byte {
	b, _ := json.Marshal(v)
	return []byte("event: " + name + "\ndata: " + string(b) + "\n\n")
}

// Open sends message_start.
func (s *anthropicStream) Open() []byte {
	return anthropicEvent("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": s.meta.ID, "type": "message", "role": "assistant", "content": []any{}, "model": s.meta.Model,
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": s.prompt, "output_tokens": 0},
	}})
}

func (s *anthropicStream) stopBlock() []byte {
	if s.block < 0 {
		return nil
	}
	b := anthropicEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.block})
	s.block = -1
	return b
}

func (s *anthropicStream) startBlock(kind string, block map[string]any) []byte {
	out := s.stopBlock()
	s.block, s.kind = s.next, kind
	s.next++
	return append(out, anthropicEvent("content_block_start", map[string]any{"type": "content_block_start", "index": s.block, "content_block": block})...)
}

// Token sends a text delta, opening the text block first.
func (s *anthropicStream) Token(text string) []byte {
	var out []byte
	if s.block < 0 || s.kind != "text" {
		out = s.startBlock("text", map[string]any{"type": "text", "text": ""})
	}
	return append(out, anthropicEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
		"delta": map[string]string{"type": "text_delta", "text": text}})...)
}

// ToolCall opens a tool_use block.
func (s *anthropicStream) ToolCall(tc *ToolCall) []byte {
	return s.startBlock("tool_use", map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": map[string]any{}})
}

// ToolArgs sends a piece of the call's input.
func (s *anthropicStream) ToolArgs(_ *ToolCall, piece string) []byte {
	return anthropicEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
		"delta": map[string]string{"type": "input_json_delta", "partial_json": piece}})
}

// Close ends the open block and the message.
func (s *anthropicStream) Close(res *ChatResult) []byte {
	out := s.stopBlock()
	out = append(out, anthropicEvent("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": anthropicStopReason(res.FinishReason)},
		"usage": map[string]int{"input_tokens": res.PromptTokens, "output_tokens": res.CompletionTokens}})...)
	return append(out, anthropicEvent("message_stop", map[string]any{"type": "message_stop"})...)
}
