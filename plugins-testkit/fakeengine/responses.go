// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// OpenAI's Responses API as vLLM serves it (vllm/entrypoints/openai/
// responses/serving.py) for a model without Harmony: input items become
// chat messages (instructions first), the chat generation answers, and
// the stream is response.created, response.in_progress, then per output
// item output_item.added (content_part.added, output_text.delta…,
// output_text.done, content_part.done for a message;
// function_call_arguments.delta…, .done for a call) and
// output_item.done, then response.completed (response.incomplete at
// max_output_tokens). Every event has a sequence_number. vLLM keeps no
// response unless VLLM_ENABLE_RESPONSES_API_STORE is set: "store" reads
// false and a previous_response_id is not found (404).

type responsesRequestIn struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       string          `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	PreviousResponseID string          `json:"previous_response_id"`
	Tools              []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

type responsesItemIn struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Output  json.RawMessage `json:"output"`
}

// writeResponsesError writes OpenAI's nested error envelope.
func writeResponsesError(w http.ResponseWriter, status int, typ, msg string) {
	WriteJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

// decodeResponses converts a Responses request to the chat request the
// generation runs.
func decodeResponses(body []byte) (*ChatRequest, *responsesRequestIn, error) {
	var in responsesRequestIn
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, nil, err
	}
	req := &ChatRequest{Model: in.Model, Stream: in.Stream, MaxTokens: in.MaxOutputTokens, Raw: map[string]json.RawMessage{}}
	if in.Instructions != "" {
		req.Messages = append(req.Messages, Message{Role: "system", Content: jsonString(in.Instructions)})
	}
	var s string
	if json.Unmarshal(in.Input, &s) == nil {
		req.Messages = append(req.Messages, Message{Role: "user", Content: jsonString(s)})
	} else {
		var items []responsesItemIn
		if err := json.Unmarshal(in.Input, &items); err != nil {
			return nil, nil, fmt.Errorf("input: %v", err)
		}
		for _, it := range items {
			switch {
			case it.Type == "function_call":
				req.Messages = append(req.Messages, Message{Role: "assistant", Content: jsonString("")})
			case it.Type == "function_call_output":
				var out string
				_ = json.Unmarshal(it.Output, &out)
				req.Messages = append(req.Messages, Message{Role: "tool", Content: jsonString(out)})
			case it.Type == "message" || it.Role != "":
				req.Messages = append(req.Messages, Message{Role: it.Role, Content: responsesText(it.Content)})
			}
		}
	}
	if len(req.Messages) == 0 {
		return nil, nil, fmt.Errorf("input: no message")
	}
	if len(in.Tools) > 0 {
		tools := make([]map[string]any, 0, len(in.Tools))
		for _, t := range in.Tools {
			tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": t.Name, "description": t.Description, "parameters": t.Parameters}})
		}
		req.Raw["tools"], _ = json.Marshal(tools)
		var choice any = "auto"
		var s string
		var named struct {
			Name string `json:"name"`
		}
		switch {
		case json.Unmarshal(in.ToolChoice, &s) == nil:
			choice = s
		case json.Unmarshal(in.ToolChoice, &named) == nil && named.Name != "":
			choice = map[string]any{"type": "function", "function": map[string]string{"name": named.Name}}
		}
		req.Raw["tool_choice"], _ = json.Marshal(choice)
	}
	return req, &in, nil
}

// responsesText is an item's content as text (a string, or its parts'
// text joined).
func responsesText(raw json.RawMessage) json.RawMessage {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return raw
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var out string
	for _, p := range parts {
		out += p.Text
	}
	return jsonString(out)
}

// ResponsesHandler serves POST /v1/responses.
func (e *Engine) ResponsesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := e.readBody(w, r)
		if !ok {
			return
		}
		req, in, err := decodeResponses(body)
		if err != nil {
			writeResponsesError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		if !e.prepareNative(w, r, req, func(msg string) { writeResponsesError(w, http.StatusNotFound, "NotFoundError", msg) }) {
			return
		}
		if in.PreviousResponseID != "" {
			// Nothing is stored without VLLM_ENABLE_RESPONSES_API_STORE.
			writeResponsesError(w, http.StatusNotFound, "invalid_request_error", fmt.Sprintf("Response with id '%s' not found.", in.PreviousResponseID))
			return
		}
		created := time.Now().Unix()
		e.generate(w, r, req, &answerEncoders{
			idPrefix: "resp_",
			stream: func(req *ChatRequest, meta ChatMeta) ChatStream {
				return &responsesStream{meta: meta, in: in, created: created, item: -1}
			},
			whole: func(res *ChatResult) any {
				s := &responsesStream{meta: res.ChatMeta, in: in, created: created, item: -1}
				if res.ToolCall != nil {
					s.items = append(s.items, s.callItem(res.ToolCall, "completed"))
				} else {
					s.items = append(s.items, s.messageItem(res.Text, "completed"))
				}
				return s.response(res)
			},
		})
	})
}

// responsesStream encodes a Responses stream.
type responsesStream struct {
	meta    ChatMeta
	in      *responsesRequestIn
	created int64
	seq     int
	item    int // the open item's index, -1 for none
	kind    string
	text    string
	call    *ToolCall
	args    string
	items   []map[string]any
}

func (s *responsesStream) event(typ string, fields map[string]any) []byte {
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	b, _ := json.Marshal(fields)
	return []byte("event: " + typ + "\ndata: " + string(b) + "\n\n")
}

func (s *responsesStream) messageItem(text, status string) map[string]any {
	return map[string]any{"id": "msg_" + s.meta.ID, "type": "message", "status": status, "role": "assistant",
		"content": []map[string]any{{"type": "output_text", "text": text, "annotations": []any{}}}}
}

func (s *responsesStream) callItem(tc *ToolCall, status string) map[string]any {
	return map[string]any{"id": "fc_" + tc.ID, "type": "function_call", "status": status, "call_id": tc.ID, "name": tc.Name, "arguments": tc.Arguments}
}

// response is the response object, with the output so far.
func (s *responsesStream) response(res *ChatResult) map[string]any {
	status, incomplete := "in_progress", any(nil)
	var usage any
	if res != nil {
		status = "completed"
		if res.FinishReason == "length" {
			status, incomplete = "incomplete", map[string]string{"reason": "max_output_tokens"}
		}
		usage = map[string]any{"input_tokens": res.PromptTokens, "input_tokens_details": map[string]int{"cached_tokens": 0},
			"output_tokens": res.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens": res.PromptTokens + res.CompletionTokens}
	}
	out := s.items
	if out == nil {
		out = []map[string]any{}
	}
	return map[string]any{"id": s.meta.ID, "object": "response", "created_at": s.created, "status": status, "model": s.meta.Model,
		"output": out, "incomplete_details": incomplete, "usage": usage, "store": false, "tools": []any{}, "tool_choice": "auto",
		"parallel_tool_calls": true}
}

// Open sends response.created and response.in_progress.
func (s *responsesStream) Open() []byte {
	out := s.event("response.created", map[string]any{"response": s.response(nil)})
	return append(out, s.event("response.in_progress", map[string]any{"response": s.response(nil)})...)
}

// closeItem ends the open item.
func (s *responsesStream) closeItem() []byte {
	if s.item < 0 {
		return nil
	}
	var out []byte
	var item map[string]any
	switch s.kind {
	case "message":
		id := "msg_" + s.meta.ID
		out = append(out, s.event("response.output_text.done", map[string]any{"item_id": id, "output_index": s.item, "content_index": 0, "text": s.text})...)
		out = append(out, s.event("response.content_part.done", map[string]any{"item_id": id, "output_index": s.item, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": s.text, "annotations": []any{}}})...)
		item = s.messageItem(s.text, "completed")
	case "function_call":
		out = append(out, s.event("response.function_call_arguments.done", map[string]any{"item_id": "fc_" + s.call.ID, "output_index": s.item, "arguments": s.args})...)
		item = s.callItem(&ToolCall{ID: s.call.ID, Name: s.call.Name, Arguments: s.args}, "completed")
	}
	out = append(out, s.event("response.output_item.done", map[string]any{"output_index": s.item, "item": item})...)
	s.items = append(s.items, item)
	s.item = -1
	return out
}

// Token sends a text delta, opening the message first.
func (s *responsesStream) Token(text string) []byte {
	var out []byte
	id := "msg_" + s.meta.ID
	if s.item < 0 || s.kind != "message" {
		out = s.closeItem()
		s.item, s.kind = len(s.items), "message"
		out = append(out, s.event("response.output_item.added", map[string]any{"output_index": s.item,
			"item": map[string]any{"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []any{}}})...)
		out = append(out, s.event("response.content_part.added", map[string]any{"item_id": id, "output_index": s.item, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})...)
	}
	s.text += text
	return append(out, s.event("response.output_text.delta", map[string]any{"item_id": id, "output_index": s.item, "content_index": 0, "delta": text})...)
}

// ToolCall opens a function_call item.
func (s *responsesStream) ToolCall(tc *ToolCall) []byte {
	out := s.closeItem()
	s.item, s.kind, s.call, s.args = len(s.items), "function_call", tc, ""
	return append(out, s.event("response.output_item.added", map[string]any{"output_index": s.item,
		"item": map[string]any{"id": "fc_" + tc.ID, "type": "function_call", "status": "in_progress", "call_id": tc.ID, "name": tc.Name, "arguments": ""}})...)
}

// ToolArgs sends a piece of the call's arguments.
func (s *responsesStream) ToolArgs(tc *ToolCall, piece string) []byte {
	s.args += piece
	return s.event("response.function_call_arguments.delta", map[string]any{"item_id": "fc_" + tc.ID, "output_index": s.item, "delta": piece})
}

// Close ends the open item and the response.
func (s *responsesStream) Close(res *ChatResult) []byte {
	out := s.closeItem()
	ev := "response.completed"
	if res.FinishReason == "length" {
		ev = "response.incomplete"
	}
	return append(out, s.event(ev, map[string]any{"response": s.response(res)})...)
}
