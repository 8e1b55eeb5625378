// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// The Anthropic Messages API's endpoints.
const (
	MessagesPath    = "/v1/messages"
	CountTokensPath = "/v1/messages/count_tokens"
)

// Messages serves POST /v1/messages, to chat deployments.
func (rt *Router) Messages(w http.ResponseWriter, r *http.Request) {
	rt.serveDialect(w, r, &messagesDialect{})
}

// CountTokens serves POST /v1/messages/count_tokens: the engine counts
// with the model's own tokenizer and chat template, never an estimate.
func (rt *Router) CountTokens(w http.ResponseWriter, r *http.Request) {
	rt.serveDialect(w, r, &countTokensDialect{})
}

// messagesRequest is a Messages (or count_tokens) request as the router
// reads it.
type messagesRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int64          `json:"max_tokens"`
	Messages      json.RawMessage `json:"messages"`
	System        json.RawMessage `json:"system"`
	Tools         json.RawMessage `json:"tools"`
	ToolChoice    json.RawMessage `json:"tool_choice"`
	StopSequences []string        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int64          `json:"top_k"`
	Stream        bool            `json:"stream"`
	// Refused: CapyCTL does not serve them.
	MCPServers json.RawMessage `json:"mcp_servers"`
	Container  json.RawMessage `json:"container"`
}

// anthropicMessage is one message of the conversation.
type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthropicInBlock is a content block of a request.
type anthropicInBlock struct {
	Type   string `json:"type"`
	Text   string `json:"text"`
	Source *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// billingHeader starts the system block Claude Code puts first, with a
// hash per request that would defeat every prefix cache; vLLM drops it
// too (vllm/entrypoints/anthropic/serving.py, _convert_system_message).
const billingHeader = "x-anthropic-billing-header"

// translateMessages builds the chat completion a Messages request
// becomes, checking every block and tool.
func translateMessages(r *messagesRequest, c *chatRequest) error {
	if present(r.System) {
		var s string
		if json.Unmarshal(r.System, &s) != nil {
			var blocks []anthropicInBlock
			if err := json.Unmarshal(r.System, &blocks); err != nil {
				return invalid("system must be a string or a list of text blocks")
			}
			var parts []string
			for i, b := range blocks {
				if b.Type != "text" {
					return refuse("system[%d] is a %q block: system takes text", i, b.Type)
				}
				if !strings.HasPrefix(b.Text, billingHeader) {
					parts = append(parts, b.Text)
				}
			}
			s = strings.Join(parts, "\n")
		}
		if s != "" {
			c.Messages = append(c.Messages, chatMessage{Role: "system", Content: textContent(s)})
		}
	}
	var msgs []anthropicMessage
	if err := json.Unmarshal(r.Messages, &msgs); err != nil || len(msgs) == 0 {
		return invalid("messages must be a non-empty list of messages")
	}
	for i, m := range msgs {
		if m.Role != "user" && m.Role != "assistant" {
			return invalid("messages[%d].role is %q: user or assistant (the system prompt is the top-level system)", i, m.Role)
		}
		out, err := anthropicToChat(i, m)
		if err != nil {
			return err
		}
		c.Messages = append(c.Messages, out...)
	}
	if present(r.Tools) {
		var tools []struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"input_schema"`
		}
		if err := json.Unmarshal(r.Tools, &tools); err != nil {
			return invalid("tools must be a list of tools: %v", err)
		}
		for i, t := range tools {
			if t.Type != "" && t.Type != "custom" {
				return refuse("tools[%d] is Anthropic's %q tool: CapyCTL serves client tools (name, description, input_schema)", i, t.Type)
			}
			if t.Name == "" {
				return invalid("tools[%d] has no name", i)
			}
			c.Tools = append(c.Tools, chatTool{Type: "function", Function: chatFunction{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
		}
	}
	if present(r.ToolChoice) {
		var tc struct {
			Type                   string `json:"type"`
			Name                   string `json:"name"`
			DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
		}
		if err := json.Unmarshal(r.ToolChoice, &tc); err != nil {
			return invalid("tool_choice: %v", err)
		}
		switch tc.Type {
		case "auto":
			c.ToolChoice = json.RawMessage(`"auto"`)
		case "any":
			c.ToolChoice = json.RawMessage(`"required"`)
		case "none":
			c.ToolChoice = json.RawMessage(`"none"`)
		case "tool":
			if tc.Name == "" {
				return invalid("tool_choice of type tool names no tool")
			}
			c.ToolChoice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}})
		default:
			return invalid("tool_choice type %q: auto, any, tool or none", tc.Type)
		}
		if tc.DisableParallelToolUse {
			f := false
			c.ParallelToolCalls = &f
		}
	}
	c.MaxTokens, c.Temperature, c.TopP, c.TopK, c.Stop = r.MaxTokens, r.Temperature, r.TopP, r.TopK, r.StopSequences
	return nil
}

// anthropicToChat turns one Messages message into chat messages: a user
// message's tool results become tool messages (before the rest of it), an
// assistant's tool uses its tool calls; thinking blocks are dropped (the
// engines' chat templates drop earlier turns' reasoning too).
func anthropicToChat(i int, m anthropicMessage) ([]chatMessage, error) {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []chatMessage{{Role: m.Role, Content: textContent(s)}}, nil
	}
	var blocks []anthropicInBlock
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return nil, invalid("messages[%d].content must be a string or a list of blocks", i)
	}
	var out []chatMessage
	var texts []string
	var parts []map[string]any
	var calls []chatToolCall
	images := false
	for j, b := range blocks {
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
			parts = append(parts, map[string]any{"type": "text", "text": b.Text})
		case "image":
			if m.Role != "user" || b.Source == nil {
				return nil, refuse("messages[%d].content[%d]: images are served in user messages, with a source", i, j)
			}
			url := b.Source.URL
			if b.Source.Type == "base64" {
				url = "data:" + b.Source.MediaType + ";base64," + b.Source.Data
			}
			if url == "" {
				return nil, refuse("messages[%d].content[%d]: an image by %q source is not served (base64 or url)", i, j, b.Source.Type)
			}
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": url}})
			images = true
		case "tool_use":
			if m.Role != "assistant" || b.ID == "" || b.Name == "" {
				return nil, invalid("messages[%d].content[%d]: a tool_use is the assistant's, with an id and a name", i, j)
			}
			tc := chatToolCall{ID: b.ID, Type: "function"}
			tc.Function.Name = b.Name
			tc.Function.Arguments = "{}"
			if present(b.Input) {
				tc.Function.Arguments = string(b.Input)
			}
			calls = append(calls, tc)
		case "tool_result":
			if m.Role != "user" || b.ToolUseID == "" {
				return nil, invalid("messages[%d].content[%d]: a tool_result is the user's, naming the tool_use_id it answers", i, j)
			}
			text, err := toolResultText(b.Content)
			if err != nil {
				return nil, refuse("messages[%d].content[%d]: %v", i, j, err)
			}
			out = append(out, chatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: textContent(text)})
		case "thinking", "redacted_thinking":
		default:
			return nil, refuse("messages[%d].content[%d] is a %q block: CapyCTL serves text, images, tool_use and tool_result", i, j, b.Type)
		}
	}
	switch {
	case images:
		b, _ := json.Marshal(parts)
		out = append(out, chatMessage{Role: m.Role, Content: b})
	case len(texts) > 0 || (len(calls) == 0 && len(out) == 0):
		out = append(out, chatMessage{Role: m.Role, Content: textContent(strings.Join(texts, "\n"))})
	}
	if len(calls) > 0 {
		if n := len(out); n > 0 && out[n-1].Role == "assistant" {
			out[n-1].ToolCalls = calls
		} else {
			out = append(out, chatMessage{Role: "assistant", Content: json.RawMessage("null"), ToolCalls: calls})
		}
	}
	return out, nil
}

// toolResultText is a tool_result's content as text.
func toolResultText(raw json.RawMessage) (string, error) {
	if !present(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthropicInBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", err
	}
	var texts []string
	for _, b := range blocks {
		if b.Type != "text" {
			return "", refuse("a %q block in a tool_result is not served (text is)", b.Type)
		}
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// parseMessages reads a Messages body; maxTokens says whether max_tokens
// is required (Messages) or not (count_tokens).
func parseMessages(q *request, r *messagesRequest, c *chatRequest, maxTokens bool) error {
	// The model by its exact name, as every route reads it (fields.go):
	// a body that names it twice or in other letters is refused before
	// the decoding below, which matches names without regard to case.
	if _, err := RequestModel(q.body); err != nil {
		return invalid("%v", err)
	}
	if err := json.Unmarshal(q.body, r); err != nil {
		return invalid("the request body is not a valid Messages request: %v", err)
	}
	q.model = r.Model
	if r.Model == "" {
		return invalid("model: the request names no model")
	}
	switch {
	case present(r.MCPServers):
		return refuse("mcp_servers is not served: the client runs its tools")
	case present(r.Container):
		return refuse("container is not served")
	case maxTokens && (r.MaxTokens == nil || *r.MaxTokens < 1):
		return invalid("max_tokens: a positive number is required")
	}
	return translateMessages(r, c)
}

// messagesDialect answers one Messages request.
type messagesDialect struct {
	req  messagesRequest
	chat chatRequest
	src  source
	t    turn
}

func (d *messagesDialect) kind() string { return "messages" }

func (d *messagesDialect) parse(q *request) error {
	if err := parseMessages(q, &d.req, &d.chat, true); err != nil {
		return err
	}
	q.stream = d.req.Stream
	if q.stream {
		d.t.sink = &messagesStream{d: d, q: q}
	}
	return nil
}

func (d *messagesDialect) route(ep *structs.EngineEndpoint) (string, bool, error) {
	if ep.MessagesPath != "" {
		return ep.MessagesPath, true, nil
	}
	return chatPathOf(ep), false, nil
}

func (d *messagesDialect) body(q *request, ep *structs.EngineEndpoint, native bool) ([]byte, error) {
	if !native {
		d.src = chatSource{}
		return d.chat.encode(ep, q.model, q.id)
	}
	d.src = messagesSource{}
	return nativeBody(q.body, ep, map[string]json.RawMessage{"stream": json.RawMessage("true")})
}

func (d *messagesDialect) event(q *request, payload []byte) (bool, string) {
	done, failed := d.src.event(&d.t, payload)
	q.noteTurn(&d.t)
	return done, failed
}

func (d *messagesDialect) whole(q *request, data []byte) error {
	if err := d.src.whole(&d.t, data); err != nil {
		return err
	}
	q.noteTurn(&d.t)
	return d.finish(q)
}

// stop is the message's stop_reason and stop_sequence.
func (d *messagesDialect) stop() (string, string) {
	switch {
	case d.t.finish == finishLength:
		return "max_tokens", ""
	case d.t.finish == finishToolCalls || d.t.hasTools():
		return "tool_use", ""
	case d.t.finish == finishContentFilter:
		return "refusal", ""
	case d.t.stopSeq != "" && slices.Contains(d.req.StopSequences, d.t.stopSeq):
		return "stop_sequence", d.t.stopSeq
	}
	return "end_turn", ""
}

// messageID is the message's ID.
func messageID(q *request) string { return "msg_" + q.requestHex() }

// usageJSON is the message's usage.
func (d *messagesDialect) usageJSON() []byte {
	u := &d.t.usage
	o := newObj(128).int("input_tokens", u.input).int("output_tokens", u.output)
	if u.cachedOK {
		o.int("cache_read_input_tokens", u.cached)
	} else {
		o.raw("cache_read_input_tokens", nil)
	}
	return o.raw("cache_creation_input_tokens", nil).bytes()
}

func (d *messagesDialect) finish(q *request) error {
	d.t.end()
	reason, seq := d.stop()
	q.setWriteDeadline()
	if !q.stream {
		o := newObj(512).str("id", messageID(q)).str("type", "message").str("role", "assistant").str("model", q.model)
		o.key("content")
		o.b = append(o.b, '[')
		for i, it := range d.t.items {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.b = append(o.b, anthropicBlockJSON(it, true)...)
		}
		o.b = append(o.b, ']')
		o.str("stop_reason", reason).strOrNull("stop_sequence", seq).raw("usage", d.usageJSON())
		o.raw("capyctl", newObj(512).raw("metrics", q.appendMetrics(nil)).bytes())
		out := append(o.bytes(), '\n')
		q.writeJSONHead(http.StatusOK, nil, "application/json", len(out))
		return q.write(out)
	}
	delta := newObj(64).str("stop_reason", reason).strOrNull("stop_sequence", seq).bytes()
	if err := q.writeEventSSE("message_delta", newObj(256).str("type", "message_delta").raw("delta", delta).raw("usage", d.usageJSON()).bytes()); err != nil {
		return err
	}
	if err := q.metricsComment(); err != nil {
		return err
	}
	if err := q.writeEventSSE("message_stop", []byte(`{"type":"message_stop"}`)); err != nil {
		return err
	}
	return q.flush()
}

func (d *messagesDialect) writeError(q *request, e *structs.Error) { writeAnthropicError(q, e) }

func (d *messagesDialect) progress(q *request) {
	// Anthropic's own keep-alive: the SDKs skip pings.
	_ = q.writeEventSSE("ping", []byte(`{"type":"ping"}`))
}

func (d *messagesDialect) engineStatus(*request, int, []byte) bool { return false }

// anthropicBlockJSON is an answer's content block: whole (a message), or
// empty as a stream's content_block_start has it.
func anthropicBlockJSON(it *turnItem, whole bool) []byte {
	switch it.kind {
	case itemReasoning:
		text := ""
		if whole {
			text = it.text.String()
		}
		return newObj(64+len(text)).str("type", "thinking").str("thinking", text).str("signature", "").bytes()
	case itemTool:
		input := json.RawMessage(`{}`)
		if whole {
			input = argsJSON(it.args.String())
		}
		return newObj(96+len(input)).str("type", "tool_use").str("id", it.callID).str("name", it.name).raw("input", input).bytes()
	}
	text := ""
	if whole {
		text = it.text.String()
	}
	return newObj(32+len(text)).str("type", "text").str("text", text).bytes()
}

// messagesStream writes a Messages stream's events as the answer forms.
type messagesStream struct {
	d *messagesDialect
	q *request
}

func (s *messagesStream) begin() {
	q := s.q
	u := &s.d.t.usage
	usage := newObj(64).int("input_tokens", u.input).int("output_tokens", 0).bytes()
	msg := newObj(256).str("id", messageID(q)).str("type", "message").str("role", "assistant").str("model", q.model).
		raw("content", []byte("[]")).raw("stop_reason", nil).raw("stop_sequence", nil).raw("usage", usage).bytes()
	_ = q.writeEventSSE("message_start", newObj(320).str("type", "message_start").raw("message", msg).bytes())
	_ = q.writeEventSSE("ping", []byte(`{"type":"ping"}`))
}

func (s *messagesStream) open(it *turnItem) {
	_ = s.q.writeEventSSE("content_block_start", newObj(160).str("type", "content_block_start").int("index", int64(it.index)).
		raw("content_block", anthropicBlockJSON(it, false)).bytes())
}

func (s *messagesStream) delta(it *turnItem, piece string) {
	var delta []byte
	switch it.kind {
	case itemText:
		delta = newObj(32+len(piece)).str("type", "text_delta").str("text", piece).bytes()
	case itemReasoning:
		delta = newObj(32+len(piece)).str("type", "thinking_delta").str("thinking", piece).bytes()
	case itemTool:
		delta = newObj(32+len(piece)).str("type", "input_json_delta").str("partial_json", piece).bytes()
	}
	_ = s.q.writeEventSSE("content_block_delta", newObj(64+len(delta)).str("type", "content_block_delta").int("index", int64(it.index)).raw("delta", delta).bytes())
}

func (s *messagesStream) close(it *turnItem) {
	_ = s.q.writeEventSSE("content_block_stop", newObj(48).str("type", "content_block_stop").int("index", int64(it.index)).bytes())
}

// anthropicErrorType is Anthropic's error type for an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnsupportedMediaType, http.StatusMethodNotAllowed:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		return "timeout_error"
	}
	return "api_error"
}

// anthropicErrorJSON is Anthropic's error envelope, with CapyCTL's code
// beside the message and the request ID as Anthropic's request_id.
func anthropicErrorJSON(e *structs.Error, status int, requestID string) []byte {
	inner := newObj(96+len(e.Message)).str("type", anthropicErrorType(status)).str("message", e.Message).str("code", string(e.Code)).bytes()
	o := newObj(128+len(inner)).str("type", "error").raw("error", inner)
	if requestID != "" {
		o.str("request_id", requestID)
	}
	return o.bytes()
}

// writeAnthropicError answers an error in Anthropic's shape: the envelope
// with its status, or an error event once the stream began.
func writeAnthropicError(q *request, e *structs.Error) {
	status := wire.HTTPStatus(e.Code)
	if q.headersSent {
		_ = q.writeEventSSE("error", anthropicErrorJSON(e, status, q.id))
		_ = q.flush()
		return
	}
	b := append(anthropicErrorJSON(e, status, q.id), '\n')
	q.writeJSONHead(status, e, "application/json", len(b))
	_ = q.write(b)
}

// WriteAnthropicError answers err in Anthropic's shape ({"type":"error",
// "error":{"type","message","code"}}) with its HTTP status, for the
// Messages routes' answers made outside the router (authentication, no
// route).
func WriteAnthropicError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	status := wire.HTTPStatus(e.Code)
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(anthropicErrorJSON(e, status, w.Header().Get(HeaderRequestID)), '\n'))
}

// ---------------------------------------------------------------- count_tokens

// countTokensDialect answers one count_tokens request: on the engine's own
// count route, which applies the model's chat template to the
// conversation and its tools, exactly as a generation would.
type countTokensDialect struct {
	req   messagesRequest
	chat  chatRequest
	model string
}

func (d *countTokensDialect) kind() string { return "count_tokens" }

func (d *countTokensDialect) parse(q *request) error {
	err := parseMessages(q, &d.req, &d.chat, false)
	d.model = q.model
	return err
}

// errNoCount is the refusal of an engine without a count route.
func errNoCount(model string) error {
	return structs.Errf(structs.CodeCountTokensUnsupported,
		"model %q runs on an engine that cannot count a conversation's tokens with the model's own tokenizer and chat template (vLLM and llama-server builds with /v1/messages/count_tokens can; SGLang, TensorFold and custom engines cannot): CapyCTL never estimates", model)
}

func (d *countTokensDialect) route(ep *structs.EngineEndpoint) (string, bool, error) {
	if ep.CountTokensPath == "" {
		return "", false, errNoCount(d.model)
	}
	return ep.CountTokensPath, true, nil
}

func (d *countTokensDialect) body(q *request, ep *structs.EngineEndpoint, _ bool) ([]byte, error) {
	return nativeBody(q.body, ep, nil, "stream")
}

func (d *countTokensDialect) event(*request, []byte) (bool, string) { return false, "" }

func (d *countTokensDialect) whole(q *request, data []byte) error {
	var v struct {
		InputTokens *int64 `json:"input_tokens"`
	}
	if err := json.Unmarshal(data, &v); err != nil || v.InputTokens == nil {
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "the engine's token count is not {\"input_tokens\": N}: %.200s", data))
		return nil
	}
	q.usage.known, q.usage.prompt = true, *v.InputTokens
	q.firstContent = time.Time{} // a count has no first token
	out := append(newObj(128).int("input_tokens", *v.InputTokens).raw("capyctl", newObj(512).raw("metrics", q.appendMetrics(nil)).bytes()).bytes(), '\n')
	q.setWriteDeadline()
	q.writeJSONHead(http.StatusOK, nil, "application/json", len(out))
	return q.write(out)
}

func (d *countTokensDialect) finish(*request) error { return nil }

func (d *countTokensDialect) writeError(q *request, e *structs.Error) { writeAnthropicError(q, e) }

func (d *countTokensDialect) progress(*request) {}

func (d *countTokensDialect) engineStatus(q *request, status int, _ []byte) bool {
	if status != http.StatusNotFound {
		return false
	}
	// A llama-server build older than the route (llama.cpp PR #17570,
	// November 2025) answers 404.
	q.done()
	q.outcome = OutcomeRefused
	q.fail(structs.Errf(structs.CodeCountTokensUnsupported,
		"the engine of model %q has no /v1/messages/count_tokens (a llama-server build older than the route, llama.cpp PR #17570): CapyCTL never estimates", q.model))
	return true
}
