// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
)

// ResponsesPath is the OpenAI Responses API's endpoint.
const ResponsesPath = "/v1/responses"

// ResponseStore is what the router needs of the stored responses
// (core/responses.Store): IDs, a previous response's conversation, and
// keeping a finished one.
type ResponseStore interface {
	Enabled() bool
	NewID(reqHex string) string
	History(owner, id string) ([]json.RawMessage, error)
	Put(structs.StoredResponse)
}

// Responses serves POST /v1/responses, to chat deployments.
func (rt *Router) Responses(w http.ResponseWriter, r *http.Request) {
	rt.serveDialect(w, r, &responsesDialect{rt: rt})
}

// responsesRequest is a Responses API request as the router reads it.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID string          `json:"previous_response_id"`
	Metadata           json.RawMessage `json:"metadata"`
	Text               json.RawMessage `json:"text"`
	Reasoning          json.RawMessage `json:"reasoning"`
	User               *string         `json:"user"`
	Truncation         *string         `json:"truncation"`
	// Refused: CapyCTL does not serve them.
	Background   *bool           `json:"background"`
	Conversation json.RawMessage `json:"conversation"`
	Prompt       json.RawMessage `json:"prompt"`
	MaxToolCalls json.RawMessage `json:"max_tool_calls"`
	TopLogprobs  json.RawMessage `json:"top_logprobs"`
	// Relayed is the server's member on a request it relays to a host
	// (honoured only on a request that came over the host link).
	Relayed *RelayedResponse `json:"capyctl"`
}

// RelayedResponse is what a server that stores responses tells the host
// it relays a Responses request to, in the request's "capyctl" member:
// the ID it chose (which names the server) and the conversation of the
// previous response it holds. The host stores nothing.
type RelayedResponse struct {
	ResponseID         string            `json:"response_id"`
	PreviousResponseID string            `json:"previous_response_id,omitempty"`
	History            []json.RawMessage `json:"history,omitempty"`
	// Store says whether the server keeps the answer (the response
	// object's "store").
	Store bool `json:"store"`
}

// responsesDialect answers one Responses request.
type responsesDialect struct {
	rt  *Router
	req responsesRequest

	owner   string
	id      string
	created int64
	store   bool // the response object's "store"
	persist bool // this role keeps it (not a host behind a server)
	input   []json.RawMessage
	history []json.RawMessage
	chat    chatRequest

	src source
	t   turn
	seq int64
}

func (d *responsesDialect) kind() string { return "responses" }

// refuse is an unsupported_parameter refusal.
func refuse(format string, args ...any) error {
	return structs.Errf(structs.CodeUnsupportedParameter, format, args...)
}

func invalid(format string, args ...any) error {
	return structs.Errf(structs.CodeInvalidRequest, format, args...)
}

func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

func (d *responsesDialect) parse(q *request) error {
	r := &d.req
	// The model by its exact name, as every route reads it (fields.go):
	// a body that names it twice or in other letters is refused before
	// the decoding below, which matches names without regard to case.
	if _, err := RequestModel(q.body); err != nil {
		return invalid("%v", err)
	}
	if err := json.Unmarshal(q.body, r); err != nil {
		return invalid("the request body is not a valid Responses request: %v", err)
	}
	q.model, q.stream = r.Model, r.Stream
	if r.Model == "" {
		return invalid("the request names no model")
	}
	switch {
	case r.Background != nil && *r.Background:
		return refuse("background is not served: CapyCTL answers a response while the client waits (stream it for long answers)")
	case present(r.Conversation):
		return refuse("conversation is not served: continue a conversation with previous_response_id")
	case present(r.Prompt):
		return refuse("prompt (a stored prompt template) is not served: send input and instructions")
	case present(r.MaxToolCalls):
		return refuse("max_tool_calls is not served")
	case present(r.TopLogprobs):
		return refuse("top_logprobs is not served")
	case r.Truncation != nil && *r.Truncation == "auto":
		return refuse(`truncation "auto" is not served: CapyCTL never drops input (leave it "disabled")`)
	}
	d.owner = CallerOf(q.r.Context()).Key
	d.created = q.start.Unix()
	d.store = r.Store == nil || *r.Store
	st := d.rt.cfg.Responses
	switch {
	case r.Relayed != nil && relayed(q.r.Context()):
		// A host behind a server: the server chose the ID, holds the
		// history and keeps the answer.
		d.id, d.store, d.history = r.Relayed.ResponseID, r.Relayed.Store, r.Relayed.History
		r.PreviousResponseID = r.Relayed.PreviousResponseID
		if d.id == "" {
			return invalid("the relayed request names no response_id")
		}
	case r.Relayed != nil:
		return invalid(`"capyctl" is a member CapyCTL's servers set on the requests they relay; a client sends none`)
	default:
		if st == nil || !st.Enabled() {
			d.store = false // responses.retention keeps nothing here
		}
		d.persist = d.store
		d.id = "resp_" + q.requestHex()
		if st != nil {
			d.id = st.NewID(q.requestHex())
		}
		if r.PreviousResponseID != "" {
			if st == nil || !st.Enabled() {
				return structs.Errf(structs.CodeResponseNotFound, "no stored response %q: this role keeps no responses (responses.retention)", r.PreviousResponseID)
			}
			h, err := st.History(d.owner, r.PreviousResponseID)
			if err != nil {
				return err
			}
			d.history = h
		}
	}
	in, err := responseInput(r.Input)
	if err != nil {
		return err
	}
	d.input = in
	if err := d.translate(); err != nil {
		return err
	}
	hex := q.requestHex()
	d.t.ids = func(prefix string, i int) string { return prefix + hex + "_" + strconv.Itoa(i) }
	if q.stream {
		d.t.sink = &responsesStream{d: d, q: q}
	}
	return nil
}

// responseInput reads input: a string (one user message) or items.
func responseInput(raw json.RawMessage) ([]json.RawMessage, error) {
	if !present(raw) {
		return nil, invalid("input is required: a string or a list of items")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b, _ := json.Marshal(map[string]string{"role": "user", "content": s})
		return []json.RawMessage{b}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, invalid("input must be a string or a list of items: %v", err)
	}
	if len(items) == 0 {
		return nil, invalid("input is an empty list")
	}
	return items, nil
}

// translate builds the chat completion the request becomes; it also
// checks every item and tool, so that a request the router cannot
// serve is refused before anything wakes, native or not.
func (d *responsesDialect) translate() error {
	r := &d.req
	c := &d.chat
	if present(r.Instructions) {
		var s string
		if err := json.Unmarshal(r.Instructions, &s); err != nil {
			return refuse("instructions must be a string")
		}
		if s != "" {
			c.Messages = append(c.Messages, chatMessage{Role: "system", Content: textContent(s)})
		}
	}
	msgs, err := itemsToChat(append(append([]json.RawMessage(nil), d.history...), d.input...), c.Messages)
	if err != nil {
		return err
	}
	c.Messages = msgs
	c.MaxTokens, c.Temperature, c.TopP, c.ParallelToolCalls = r.MaxOutputTokens, r.Temperature, r.TopP, r.ParallelToolCalls
	if r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1 {
		return invalid("max_output_tokens must be at least 1")
	}
	if present(r.Tools) {
		var tools []struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		if err := json.Unmarshal(r.Tools, &tools); err != nil {
			return invalid("tools must be a list of tools: %v", err)
		}
		for i, t := range tools {
			if t.Type != "function" {
				return refuse("tools[%d] is a %q tool: CapyCTL serves function tools (the model's own tools run where the client runs them)", i, t.Type)
			}
			if t.Name == "" {
				return invalid("tools[%d] has no name", i)
			}
			c.Tools = append(c.Tools, chatTool{Type: "function", Function: chatFunction{Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: t.Strict}})
		}
	}
	if present(r.ToolChoice) {
		tc, err := responsesToolChoice(r.ToolChoice)
		if err != nil {
			return err
		}
		c.ToolChoice = tc
	}
	if present(r.Text) {
		var text struct {
			Format *struct {
				Type        string          `json:"type"`
				Name        string          `json:"name"`
				Schema      json.RawMessage `json:"schema"`
				Strict      *bool           `json:"strict"`
				Description string          `json:"description"`
			} `json:"format"`
		}
		if err := json.Unmarshal(r.Text, &text); err != nil {
			return invalid("text: %v", err)
		}
		if f := text.Format; f != nil {
			switch f.Type {
			case "", "text":
			case "json_object":
				c.ResponseFormat = json.RawMessage(`{"type":"json_object"}`)
			case "json_schema":
				js := map[string]any{"name": f.Name, "schema": f.Schema}
				if f.Strict != nil {
					js["strict"] = *f.Strict
				}
				if f.Description != "" {
					js["description"] = f.Description
				}
				c.ResponseFormat, _ = json.Marshal(map[string]any{"type": "json_schema", "json_schema": js})
			default:
				return refuse("text.format type %q is not served (text, json_object, json_schema are)", f.Type)
			}
		}
	}
	if present(r.Reasoning) {
		var re struct {
			Effort string `json:"effort"`
		}
		if json.Unmarshal(r.Reasoning, &re) == nil {
			c.ReasoningEffort = re.Effort
		}
	}
	return nil
}

// responsesToolChoice is a Responses tool_choice in chat's words.
func responsesToolChoice(raw json.RawMessage) (json.RawMessage, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return raw, nil
		}
		return nil, invalid("tool_choice %q: auto, none, required or a function", s)
	}
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return nil, invalid("tool_choice: %v", err)
	}
	if tc.Type != "function" || tc.Name == "" {
		return nil, refuse("tool_choice of type %q is not served (auto, none, required, or {\"type\":\"function\",\"name\":...})", tc.Type)
	}
	b, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}})
	return b, nil
}

// responseItem is an input item as the router reads it.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// responsePart is one part of an item's content.
type responsePart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL string `json:"image_url"`
	FileID   string `json:"file_id"`
	Detail   string `json:"detail"`
}

// itemsToChat turns Responses items into chat messages, after msgs.
// Function calls join the assistant message before them (a model's
// parallel calls are one message); reasoning items are dropped (the
// engines' chat templates drop earlier turns' reasoning too).
func itemsToChat(items []json.RawMessage, msgs []chatMessage) ([]chatMessage, error) {
	for i, raw := range items {
		var it responseItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, invalid("input[%d] is not an item: %v", i, err)
		}
		if it.Type == "" && it.Role != "" {
			it.Type = "message"
		}
		switch it.Type {
		case "message":
			m, err := messageItem(i, &it)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, invalid("input[%d]: a function_call needs call_id and name", i)
			}
			tc := chatToolCall{ID: it.CallID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = it.Name, it.Arguments
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, tc)
			} else {
				msgs = append(msgs, chatMessage{Role: "assistant", Content: json.RawMessage("null"), ToolCalls: []chatToolCall{tc}})
			}
		case "function_call_output":
			if it.CallID == "" {
				return nil, invalid("input[%d]: a function_call_output needs the call_id it answers", i)
			}
			out, err := outputText(it.Output)
			if err != nil {
				return nil, invalid("input[%d].output: %v", i, err)
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: it.CallID, Content: textContent(out)})
		case "reasoning":
		case "item_reference":
			return nil, refuse("input[%d]: item_reference is not served: continue with previous_response_id, or send the items", i)
		default:
			return nil, refuse("input[%d] is a %q item: CapyCTL serves messages, function calls and their outputs", i, it.Type)
		}
	}
	return msgs, nil
}

// messageItem is a message item as a chat message. Roles: user, system,
// assistant; developer reads as system (the engines' chat templates know
// no developer role).
func messageItem(i int, it *responseItem) (chatMessage, error) {
	role := it.Role
	switch role {
	case "user", "system", "assistant":
	case "developer":
		role = "system"
	default:
		return chatMessage{}, invalid("input[%d] has role %q (user, assistant, system, developer)", i, it.Role)
	}
	var s string
	if json.Unmarshal(it.Content, &s) == nil {
		return chatMessage{Role: role, Content: textContent(s)}, nil
	}
	var parts []responsePart
	if err := json.Unmarshal(it.Content, &parts); err != nil {
		return chatMessage{}, invalid("input[%d].content must be a string or a list of parts", i)
	}
	var texts []string
	var chatParts []map[string]any
	images := false
	for j, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
			chatParts = append(chatParts, map[string]any{"type": "text", "text": p.Text})
		case "refusal":
			texts = append(texts, p.Refusal)
			chatParts = append(chatParts, map[string]any{"type": "text", "text": p.Refusal})
		case "input_image":
			if p.ImageURL == "" {
				return chatMessage{}, refuse("input[%d].content[%d]: an image by file_id is not served (send image_url)", i, j)
			}
			if role != "user" {
				return chatMessage{}, refuse("input[%d].content[%d]: images are served in user messages", i, j)
			}
			img := map[string]any{"url": p.ImageURL}
			if p.Detail != "" && p.Detail != "auto" {
				img["detail"] = p.Detail
			}
			chatParts = append(chatParts, map[string]any{"type": "image_url", "image_url": img})
			images = true
		default:
			return chatMessage{}, refuse("input[%d].content[%d] is %q content: CapyCTL serves text and images by URL", i, j, p.Type)
		}
	}
	if images {
		b, _ := json.Marshal(chatParts)
		return chatMessage{Role: role, Content: b}, nil
	}
	return chatMessage{Role: role, Content: textContent(strings.Join(texts, ""))}, nil
}

// outputText is a function_call_output's output as text: a string, or
// the text of its parts.
func outputText(raw json.RawMessage) (string, error) {
	if !present(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []responsePart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("a string or a list of parts")
	}
	var b strings.Builder
	for j, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			b.WriteString(p.Text)
		default:
			return "", fmt.Errorf("part %d is %q: a function's output is served as text", j, p.Type)
		}
	}
	return b.String(), nil
}

func (d *responsesDialect) route(ep *structs.EngineEndpoint) (string, bool, error) {
	if ep.ResponsesPath != "" {
		return ep.ResponsesPath, true, nil
	}
	return chatPathOf(ep), false, nil
}

// chatPathOf is the engine's chat route.
func chatPathOf(ep *structs.EngineEndpoint) string {
	if ep.ChatPath != "" {
		return ep.ChatPath
	}
	return "/v1/chat/completions"
}

func (d *responsesDialect) body(q *request, ep *structs.EngineEndpoint, native bool) ([]byte, error) {
	if !native {
		d.src = chatSource{}
		return d.chat.encode(ep, q.model, q.id)
	}
	d.src = &responsesSource{}
	set := map[string]json.RawMessage{"stream": json.RawMessage("true"), "store": json.RawMessage("false")}
	if len(d.history) > 0 {
		// The engine gets the whole conversation: CapyCTL, not the
		// engine, keeps the previous responses.
		set["input"], _ = json.Marshal(append(append([]json.RawMessage(nil), d.history...), d.input...))
	}
	return nativeBody(q.body, ep, set, "previous_response_id", "capyctl")
}

func (d *responsesDialect) event(q *request, payload []byte) (bool, string) {
	done, failed := d.src.event(&d.t, payload)
	q.noteTurn(&d.t)
	return done, failed
}

func (d *responsesDialect) whole(q *request, data []byte) error {
	if err := d.src.whole(&d.t, data); err != nil {
		return err
	}
	q.noteTurn(&d.t)
	return d.finish(q)
}

// status is the response's status at the end, with incomplete_details'
// reason.
func (d *responsesDialect) status() (string, string) {
	switch d.t.finish {
	case finishLength:
		return "incomplete", "max_output_tokens"
	case finishContentFilter:
		return "incomplete", "content_filter"
	}
	return "completed", ""
}

func (d *responsesDialect) finish(q *request) error {
	d.t.end()
	status, reason := d.status()
	obj := d.object(q, status, reason, nil, true)
	if d.persist {
		// IMPORTANT: before the client has the answer, so that a request
		// naming it right after finds it (Put never waits for the disk).
		input, _ := json.Marshal(d.input)
		d.rt.cfg.Responses.Put(structs.StoredResponse{ID: d.id, Owner: d.owner, CreatedAt: q.start.UTC(),
			PreviousID: d.req.PreviousResponseID, Input: input, Response: obj})
	}
	q.setWriteDeadline()
	if !q.stream {
		out := append(obj, '\n')
		q.writeJSONHead(http.StatusOK, nil, "application/json", len(out))
		return q.write(out)
	}
	if err := q.metricsComment(); err != nil {
		return err
	}
	ev := "response.completed"
	if status == "incomplete" {
		ev = "response.incomplete"
	}
	if err := d.send(q, ev, func(o *jsonObj) { o.raw("response", obj) }); err != nil {
		return err
	}
	return q.flush()
}

func (d *responsesDialect) writeError(q *request, e *structs.Error) {
	if !q.headersSent {
		info := e.Info()
		b := errorJSON(e, info)
		q.writeJSONHead(q.status, e, "application/json", len(b))
		_ = q.write(b)
		return
	}
	// In the stream: the response fails (opened first when the stream
	// began with progress comments only).
	d.t.begin()
	errObj := newObj(128).str("code", string(e.Code)).str("message", e.Message).bytes()
	obj := d.object(q, "failed", "", errObj, false)
	_ = d.send(q, "response.failed", func(o *jsonObj) { o.raw("response", obj) })
	_ = q.flush()
}

func (d *responsesDialect) progress(*request) {}

func (d *responsesDialect) engineStatus(*request, int, []byte) bool { return false }

// send writes one event of the stream, numbered.
func (d *responsesDialect) send(q *request, typ string, fill func(o *jsonObj)) error {
	o := newObj(256).str("type", typ).int("sequence_number", d.seq)
	d.seq++
	if fill != nil {
		fill(o)
	}
	return q.writeEventSSE(typ, o.bytes())
}

// object is the response object: its status, its output so far (with
// the usage and CapyCTL's metrics when final), the request's settings
// echoed.
func (d *responsesDialect) object(q *request, status, incomplete string, errObj []byte, final bool) []byte {
	r := &d.req
	o := newObj(1024).str("id", d.id).str("object", "response").int("created_at", d.created).str("status", status).
		bool("background", false).raw("error", errObj)
	if incomplete != "" {
		o.raw("incomplete_details", newObj(32).str("reason", incomplete).bytes())
	} else {
		o.raw("incomplete_details", nil)
	}
	o.raw("instructions", r.Instructions)
	if r.MaxOutputTokens != nil {
		o.int("max_output_tokens", *r.MaxOutputTokens)
	} else {
		o.raw("max_output_tokens", nil)
	}
	o.str("model", q.model)
	o.key("output")
	o.b = append(o.b, '[')
	for i, it := range d.t.items {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.b = append(o.b, responseItemJSON(it, itemStatus(it, status))...)
	}
	o.b = append(o.b, ']')
	o.bool("parallel_tool_calls", r.ParallelToolCalls == nil || *r.ParallelToolCalls)
	o.strOrNull("previous_response_id", r.PreviousResponseID)
	if present(r.Reasoning) {
		o.raw("reasoning", r.Reasoning)
	} else {
		o.raw("reasoning", []byte(`{"effort":null,"summary":null}`))
	}
	o.bool("store", d.store)
	o.any("temperature", r.Temperature)
	if present(r.Text) {
		o.raw("text", r.Text)
	} else {
		o.raw("text", []byte(`{"format":{"type":"text"}}`))
	}
	if present(r.ToolChoice) {
		o.raw("tool_choice", r.ToolChoice)
	} else {
		o.str("tool_choice", "auto")
	}
	if present(r.Tools) {
		o.raw("tools", r.Tools)
	} else {
		o.raw("tools", []byte("[]"))
	}
	o.any("top_p", r.TopP)
	o.str("truncation", "disabled")
	if final && d.t.usage.known {
		u := &d.t.usage
		o.raw("usage", newObj(192).int("input_tokens", u.input).
			raw("input_tokens_details", newObj(32).int("cached_tokens", u.cached).bytes()).
			int("output_tokens", u.output).
			raw("output_tokens_details", newObj(32).int("reasoning_tokens", u.reasoning).bytes()).
			int("total_tokens", u.input+u.output).bytes())
	} else {
		o.raw("usage", nil)
	}
	if r.User != nil {
		o.str("user", *r.User)
	}
	if present(r.Metadata) {
		o.raw("metadata", r.Metadata)
	} else {
		o.raw("metadata", []byte("{}"))
	}
	if final {
		o.raw("capyctl", newObj(512).raw("metrics", q.appendMetrics(nil)).bytes())
	}
	return o.bytes()
}

// itemStatus is an output item's status in a response of status.
func itemStatus(it *turnItem, status string) string {
	switch {
	case !it.closed:
		return "in_progress"
	case status == "incomplete":
		return "incomplete"
	}
	return "completed"
}

// responseItemJSON is an output item, whole.
func responseItemJSON(it *turnItem, status string) []byte {
	o := newObj(128+it.text.Len()+it.args.Len()).str("id", it.id)
	switch it.kind {
	case itemText:
		o.str("type", "message").str("status", status).str("role", "assistant")
		o.raw("content", append(append([]byte{'['}, outputTextPart(it.text.String())...), ']'))
	case itemReasoning:
		o.str("type", "reasoning").raw("summary", []byte("[]"))
		o.raw("content", append(append([]byte{'['}, reasoningPart(it.text.String())...), ']'))
		o.str("status", status)
	case itemTool:
		o.str("type", "function_call").str("status", status).str("call_id", it.callID).str("name", it.name).str("arguments", it.args.String())
	}
	return o.bytes()
}

func outputTextPart(text string) []byte {
	return newObj(64+len(text)).str("type", "output_text").str("text", text).raw("annotations", []byte("[]")).raw("logprobs", []byte("[]")).bytes()
}

func reasoningPart(text string) []byte {
	return newObj(48+len(text)).str("type", "reasoning_text").str("text", text).bytes()
}

// responsesStream writes a Responses stream's events as the answer forms.
type responsesStream struct {
	d *responsesDialect
	q *request
}

func (s *responsesStream) begin() {
	obj := s.d.object(s.q, "in_progress", "", nil, false)
	_ = s.d.send(s.q, "response.created", func(o *jsonObj) { o.raw("response", obj) })
	_ = s.d.send(s.q, "response.in_progress", func(o *jsonObj) { o.raw("response", obj) })
}

func (s *responsesStream) open(it *turnItem) {
	d, q := s.d, s.q
	var added []byte
	switch it.kind {
	case itemText:
		added = newObj(128).str("id", it.id).str("type", "message").str("status", "in_progress").str("role", "assistant").raw("content", []byte("[]")).bytes()
	case itemReasoning:
		added = newObj(96).str("id", it.id).str("type", "reasoning").raw("summary", []byte("[]")).bytes()
	case itemTool:
		added = newObj(160).str("id", it.id).str("type", "function_call").str("status", "in_progress").
			str("call_id", it.callID).str("name", it.name).str("arguments", "").bytes()
	}
	_ = d.send(q, "response.output_item.added", func(o *jsonObj) { o.int("output_index", int64(it.index)).raw("item", added) })
	switch it.kind {
	case itemText:
		_ = d.send(q, "response.content_part.added", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).raw("part", outputTextPart(""))
		})
	case itemReasoning:
		_ = d.send(q, "response.content_part.added", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).raw("part", reasoningPart(""))
		})
	}
}

func (s *responsesStream) delta(it *turnItem, piece string) {
	d, q := s.d, s.q
	switch it.kind {
	case itemText:
		_ = d.send(q, "response.output_text.delta", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).str("delta", piece).raw("logprobs", []byte("[]"))
		})
	case itemReasoning:
		_ = d.send(q, "response.reasoning_text.delta", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).str("delta", piece)
		})
	case itemTool:
		_ = d.send(q, "response.function_call_arguments.delta", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).str("delta", piece)
		})
	}
}

func (s *responsesStream) close(it *turnItem) {
	d, q := s.d, s.q
	text := it.text.String()
	switch it.kind {
	case itemText:
		_ = d.send(q, "response.output_text.done", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).str("text", text).raw("logprobs", []byte("[]"))
		})
		_ = d.send(q, "response.content_part.done", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).raw("part", outputTextPart(text))
		})
	case itemReasoning:
		_ = d.send(q, "response.reasoning_text.done", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).str("text", text)
		})
		_ = d.send(q, "response.content_part.done", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).int("content_index", 0).raw("part", reasoningPart(text))
		})
	case itemTool:
		_ = d.send(q, "response.function_call_arguments.done", func(o *jsonObj) {
			o.str("item_id", it.id).int("output_index", int64(it.index)).str("name", it.name).str("arguments", it.args.String())
		})
	}
	item := responseItemJSON(it, "completed")
	_ = d.send(q, "response.output_item.done", func(o *jsonObj) { o.int("output_index", int64(it.index)).raw("item", item) })
}
