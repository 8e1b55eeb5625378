// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strings"
)

// Function calls, as the engines' OpenAI servers stream them: the first
// chunk of a call carries its index, id, type and name with empty
// arguments, the next ones pieces of the arguments, and the answer ends
// with finish_reason "tool_calls" (vLLM's hermes-style parsers,
// vllm/entrypoints/openai/chat_completion/serving.py; SGLang's
// FunctionCallParser; llama-server's diffs, tools/server). A whole answer
// has "tool_calls" in its message and "content": null.
//
// The fake model calls a function deterministically, so that tests drive
// a whole round trip (a call, the client's result, the final answer):
//
//   - tool_choice "none": never; "required": the first tool; a named
//     function: that one;
//   - "auto" (or none given): the first tool whose name the last user
//     message mentions, while the conversation ends with that message;
//   - arguments: every parameter of the tool's JSON schema, in name
//     order: a string gets the last user message, a number 1, a boolean
//     true, anything else null;
//   - after a tool result (the last message has role "tool"), the answer
//     is text that starts "Tool result: " and the result (cut, like any
//     answer, at the token bound).

// ToolCall is a function call the fake model makes.
type ToolCall struct {
	// ID names the call ("call_…"; vLLM's "chatcmpl-tool-…").
	ID string
	// Name is the function's name.
	Name string
	// Arguments is the call's arguments, JSON.
	Arguments string
}

// toolParam is a request's tool, as the fake reads it.
type toolParam struct {
	Type     string `json:"type"`
	Function struct {
		Name       string `json:"name"`
		Parameters struct {
			Properties map[string]struct {
				Type string `json:"type"`
			} `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

// planTool decides whether the answer calls a function; when it does it
// sets res and returns the arguments in pieces (the streamed deltas).
func (e *Engine) planTool(req *ChatRequest, res *ChatResult) []string {
	var tools []toolParam
	if raw := req.Raw["tools"]; len(raw) == 0 || json.Unmarshal(raw, &tools) != nil || len(tools) == 0 {
		return nil
	}
	lastRole := ""
	if n := len(req.Messages); n > 0 {
		lastRole = req.Messages[n-1].Role
	}
	var pick *toolParam
	var choice any
	_ = json.Unmarshal(req.Raw["tool_choice"], &choice)
	switch c := choice.(type) {
	case string:
		switch c {
		case "none":
			return nil
		case "required":
			pick = &tools[0]
		}
	case map[string]any:
		fn, _ := c["function"].(map[string]any)
		name, _ := fn["name"].(string)
		for i := range tools {
			if tools[i].Function.Name == name {
				pick = &tools[i]
			}
		}
	}
	if pick == nil {
		if lastRole != "user" {
			return nil
		}
		text := req.LastUserText()
		for i := range tools {
			if tools[i].Function.Name != "" && strings.Contains(text, tools[i].Function.Name) {
				pick = &tools[i]
				break
			}
		}
	}
	if pick == nil {
		return nil
	}
	args := toolArguments(pick, req.LastUserText())
	res.ToolCall = &ToolCall{ID: e.toolCallID(), Name: pick.Function.Name, Arguments: args}
	res.FinishReason = "tool_calls"
	return splitPieces(args, 8)
}

// toolArguments fills a tool's parameters (see the package's rules).
func toolArguments(t *toolParam, user string) string {
	names := make([]string, 0, len(t.Function.Parameters.Properties))
	for n := range t.Function.Parameters.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(n)
		b.Write(k)
		b.WriteByte(':')
		var v any
		switch t.Function.Parameters.Properties[n].Type {
		case "string":
			v = user
		case "number", "integer":
			v = 1
		case "boolean":
			v = true
		}
		vb, _ := json.Marshal(v)
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.String()
}

// splitPieces cuts s into pieces of n bytes (the last shorter).
func splitPieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// toolCallID is a new call's ID in the flavour's shape.
func (e *Engine) toolCallID() string {
	if f, ok := e.flavour.(interface{ ToolCallID() string }); ok {
		return f.ToolCallID()
	}
	return "call_" + randHex(12)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// afterToolResult starts the answer with the tool's result when the
// conversation ends with one.
func afterToolResult(req *ChatRequest, toks []string) []string {
	n := len(req.Messages)
	if n == 0 || req.Messages[n-1].Role != "tool" {
		return toks
	}
	head := []string{"Tool", " result:"}
	for _, w := range strings.Fields(req.Messages[n-1].Text()) {
		head = append(head, " "+w)
	}
	head[len(head)-1] += "."
	out := head
	for _, t := range toks {
		out = append(out, " "+strings.TrimLeft(t, " "))
	}
	return out[:min(len(out), max(len(toks), 2))]
}

// ToolStream is a chat stream that encodes function calls: the chunk that
// opens a call, and one per piece of its arguments.
type ToolStream interface {
	ToolCall(tc *ToolCall) []byte
	ToolArgs(tc *ToolCall, piece string) []byte
}

// toolEmitter emits a call's pieces through enc: the opening chunk before
// the first piece.
func toolEmitter(enc ChatStream, tc *ToolCall) func(string) []byte {
	ts, ok := enc.(ToolStream)
	if !ok {
		return enc.Token
	}
	opened := false
	return func(piece string) []byte {
		var b []byte
		if !opened {
			opened = true
			b = ts.ToolCall(tc)
		}
		return append(b, ts.ToolArgs(tc, piece)...)
	}
}

// toolCallDelta is a chunk's piece of a call.
type toolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function toolFunctionDelta `json:"function"`
}

type toolFunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// toolChunk is a chat.completion.chunk carrying a call's delta.
type toolChunk struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint,omitempty"`
	Choices           []toolChoice `json:"choices"`
}

type toolChoice struct {
	Index int `json:"index"`
	Delta struct {
		ToolCalls []toolCallDelta `json:"tool_calls"`
	} `json:"delta"`
	FinishReason any `json:"finish_reason"`
}

func toolChunkOf(meta ChatMeta, fingerprint string, d toolCallDelta) []byte {
	c := toolChunk{ID: meta.ID, Object: "chat.completion.chunk", Created: meta.Created, Model: meta.Model, SystemFingerprint: fingerprint,
		Choices: []toolChoice{{}}}
	c.Choices[0].Delta.ToolCalls = []toolCallDelta{d}
	return SSEData(c)
}

// ToolCall opens a call.
func (s *OpenAIStream) ToolCall(tc *ToolCall) []byte {
	return toolChunkOf(s.Meta, "", toolCallDelta{ID: tc.ID, Type: "function", Function: toolFunctionDelta{Name: tc.Name}})
}

// ToolArgs sends a piece of a call's arguments.
func (s *OpenAIStream) ToolArgs(_ *ToolCall, piece string) []byte {
	return toolChunkOf(s.Meta, "", toolCallDelta{Function: toolFunctionDelta{Arguments: piece}})
}

// ToolCall opens a call (llama-server: with the system fingerprint).
func (s *llamaStream) ToolCall(tc *ToolCall) []byte {
	return toolChunkOf(s.meta, LlamaCppBuild, toolCallDelta{ID: tc.ID, Type: "function", Function: toolFunctionDelta{Name: tc.Name}})
}

// ToolArgs sends a piece of a call's arguments.
func (s *llamaStream) ToolArgs(_ *ToolCall, piece string) []byte {
	return toolChunkOf(s.meta, LlamaCppBuild, toolCallDelta{Function: toolFunctionDelta{Arguments: piece}})
}

// wholeToolCalls is a whole answer's tool_calls.
func wholeToolCalls(res *ChatResult) []WholeToolCall {
	if res.ToolCall == nil {
		return nil
	}
	tc := WholeToolCall{ID: res.ToolCall.ID, Type: "function"}
	tc.Function.Name, tc.Function.Arguments = res.ToolCall.Name, res.ToolCall.Arguments
	return []WholeToolCall{tc}
}

// WholeToolCall is one call of a whole answer's message.
type WholeToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// MarshalJSON writes "content": null beside tool calls, as the engines do.
func (m ChatMessage) MarshalJSON() ([]byte, error) {
	type plain struct {
		Role      string          `json:"role"`
		Content   *string         `json:"content"`
		ToolCalls []WholeToolCall `json:"tool_calls,omitempty"`
	}
	p := plain{Role: m.Role, ToolCalls: m.ToolCalls}
	if len(m.ToolCalls) == 0 || m.Content != "" {
		c := m.Content
		p.Content = &c
	}
	return json.Marshal(p)
}

// wholeMessage is a finished answer's message: its text, or its calls.
func wholeMessage(res *ChatResult) *ChatMessage {
	if res.ToolCall != nil {
		return &ChatMessage{Role: "assistant", ToolCalls: wholeToolCalls(res)}
	}
	return &ChatMessage{Role: "assistant", Content: res.Text}
}
