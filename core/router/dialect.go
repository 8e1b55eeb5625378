// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// A dialect is an inference API the router answers from a chat
// deployment in another shape than chat completions: OpenAI's Responses
// API (responses.go), Anthropic's Messages API and its token count
// (messages.go). A dialect request takes the chat path in full —
// admission, activation, cancellation on hang-up, settlement, request IDs,
// the request log, per-answer metrics — and the dialect only reads the
// client's body, builds the engine's, reads the engine's answer into a
// turn and writes the client's. The hooks are marked "dialect:" where the
// chat path calls them.
//
// Native or translated: where the engine serves the client's API itself
// (the driver names the route in the endpoint: MessagesPath,
// ResponsesPath, CountTokensPath), the request goes there and the engine
// renders it to its prompt; otherwise it is translated to a chat
// completion. Either way the engine's answer is read into a turn and the
// client's events are CapyCTL's, so both paths answer alike.
//
// A dialect stream stays on its net/http handler (it is not taken over,
// hijack.go): its events are re-encoded, not relayed byte for byte.
type dialect interface {
	// kind names the route in the request log, the metrics and the
	// dashboard: "responses", "messages", "count_tokens".
	kind() string
	// parse reads the client's body: q.model and q.stream, and whatever
	// the dialect needs; an error is answered in the dialect's shape,
	// before anything wakes.
	parse(q *request) error
	// route picks the engine's route for a target: its path and whether
	// the engine speaks the client's API there (native).
	route(ep *structs.EngineEndpoint) (path string, native bool, err error)
	// body is the engine's request body.
	body(q *request, ep *structs.EngineEndpoint, native bool) ([]byte, error)
	// event reads one event of the engine's stream (see source.event) and
	// writes what the client gets of it.
	event(q *request, payload []byte) (done bool, failed string)
	// whole reads an answer the engine sent as one JSON body and writes
	// the client's whole answer.
	whole(q *request, data []byte) error
	// finish writes the end of a complete answer.
	finish(q *request) error
	// writeError writes an error in the API's shape: as the answer, or in
	// the stream once it began.
	writeError(q *request, e *structs.Error)
	// progress writes what a stream waiting for a place or an activation
	// sends beside the progress comment.
	progress(q *request)
	// engineStatus answers an engine's error status itself; false leaves
	// it to the chat path.
	engineStatus(q *request, status int, body []byte) bool
}

// dialectData handles a data event of the engine's stream for a dialect
// request (sseEvent).
func (q *request) dialectData(st *sseState, sr *sseReader, payload []byte) {
	before := q.contentN
	done, failed := q.dl.event(q, payload)
	if failed != "" {
		if st.engineErr == nil {
			b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": failed}})
			st.engineErr = b
		}
		return
	}
	if q.contentN > before {
		q.lastContent = time.Now()
		if q.firstContent.IsZero() {
			// From the first output on, the stream idle bound replaces
			// the request deadline.
			q.firstContent = q.lastContent
			sr.readWithin(q.b.streamIdle)
		}
	}
	if done {
		st.sawDone = true
	}
	if q.stream && q.headersSent {
		st.wrote = true
	}
}

// noteTurn brings the request's figures up to a turn: the output counted
// (first content, decode rate), the finish seen, the engine's usage.
func (q *request) noteTurn(t *turn) {
	q.contentN = t.outputs
	if t.finish != "" {
		q.sawFinish = true
	}
	if t.usage.known {
		q.usage.known = true
		q.usage.prompt, q.usage.completion = t.usage.input, t.usage.output
		q.usage.cached, q.usage.cachedOK = t.usage.cached, t.usage.cachedOK
	}
}

// dialectFail writes an error for a dialect request: the dialect's shape,
// with the chat path's bookkeeping (fail).
func (q *request) dialectFail(e *structs.Error) {
	if !q.headersSent {
		q.status = wire.HTTPStatus(e.Code)
	}
	q.dl.writeError(q, e)
}

// writeJSONHead commits a whole JSON answer's head with status (Retry-After
// on a 429, as WriteError does).
func (q *request) writeJSONHead(status int, e *structs.Error, contentType string, n int) {
	h := q.w.Header()
	if e != nil {
		if e.RetryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
		} else if status == http.StatusTooManyRequests {
			h.Set("Retry-After", "1")
		}
	}
	h.Set("Content-Type", contentType)
	if n >= 0 {
		h.Set("Content-Length", strconv.Itoa(n))
	}
	q.w.WriteHeader(status)
	q.status = status
	q.headersSent = true
}

// writeEventSSE writes one named SSE event ("event: <name>\ndata: <json>").
func (q *request) writeEventSSE(name string, data []byte) error {
	if !q.headersSent {
		q.sseHeaders()
	}
	b := make([]byte, 0, len(name)+len(data)+20)
	b = append(b, "event: "...)
	b = append(b, name...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	b = append(b, "\n\n"...)
	return q.write(b)
}

// metricsComment writes the per-answer metrics as an SSE comment, as a
// chat stream has them before [DONE].
func (q *request) metricsComment() error {
	b := make([]byte, 0, 512)
	b = append(b, ": x-capyctl-metrics "...)
	b = q.appendMetrics(b)
	b = append(b, "\n\n"...)
	return q.write(b)
}

// requestHex is the hex part of the request's ID ("capy-" and 24 hex
// digits), which the dialects' IDs carry.
func (q *request) requestHex() string {
	if len(q.id) > 5 {
		return q.id[5:]
	}
	return q.id
}

// randomHex returns n random hex digits.
func randomHex(n int) string {
	const hexd = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = hexd[rand.IntN(16)]
	}
	return string(b)
}

// ---------------------------------------------------------------- chat

// chatRequest is the chat completion a translated request becomes.
type chatRequest struct {
	Model             string          `json:"model"`
	Messages          []chatMessage   `json:"messages"`
	MaxTokens         *int64          `json:"max_tokens,omitempty"`
	Temperature       *float64        `json:"temperature,omitempty"`
	TopP              *float64        `json:"top_p,omitempty"`
	TopK              *int64          `json:"top_k,omitempty"`
	Stop              []string        `json:"stop,omitempty"`
	Tools             []chatTool      `json:"tools,omitempty"`
	ToolChoice        json.RawMessage `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
	ResponseFormat    json.RawMessage `json:"response_format,omitempty"`
	ReasoningEffort   string          `json:"reasoning_effort,omitempty"`
	Stream            bool            `json:"stream"`
	StreamOptions     struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// chatMessage is one message of a chat completion request.
type chatMessage struct {
	Role string `json:"role"`
	// Content is a string, an array of parts, or null (an assistant
	// message that only calls functions).
	Content    json.RawMessage `json:"content"`
	ToolCalls  []chatToolCall  `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatTool struct {
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// textContent is s as a message's content.
func textContent(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// encode is the chat body for an engine: its served name, a stream with
// usage (the router reads the engine's answer as a stream, whatever the
// client asked: every engine stops a streamed request when its connection
// closes), and the request ID where the engine takes it in the body.
func (c *chatRequest) encode(ep *structs.EngineEndpoint, model, requestID string) ([]byte, error) {
	c.Model = model
	if ep.ServedName != "" {
		c.Model = ep.ServedName
	}
	c.Stream = true
	c.StreamOptions.IncludeUsage = true
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	if ep.RequestIDField != "" {
		b = b[:len(b)-1]
		b = appendMember(b, ep.RequestIDField)
		b = appendJSONString(b, requestID)
		b = append(b, '}')
	}
	return b, nil
}

// nativeBody is a client's body for an engine's own route: the served
// name for the model, the members in set replaced (or added), those in
// drop removed.
func nativeBody(body []byte, ep *structs.EngineEndpoint, set map[string]json.RawMessage, drop ...string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	if ep.ServedName != "" {
		m["model"], _ = json.Marshal(ep.ServedName)
	}
	for _, k := range drop {
		delete(m, k)
	}
	for k, v := range set {
		m[k] = v
	}
	return json.Marshal(m)
}

// dialectStatus lets the dialect answer an engine's error status itself
// (relay); false leaves it to engineStatusError.
func (q *request) dialectStatus(call *engineCall) bool {
	resp := call.Resp
	if resp.StatusCode != http.StatusNotFound {
		return false
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if !q.dl.engineStatus(q, resp.StatusCode, msg) {
		// Read already: answered as engineStatusError would.
		call.finish(false)
		q.endAt = time.Now()
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "%s", engineMessage(msg, resp.StatusCode)).WithDetail("engine_status", resp.StatusCode))
		return true
	}
	call.finish(false)
	q.endAt = time.Now()
	return true
}
