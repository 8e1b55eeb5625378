// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ChatRequest is the part of an OpenAI chat body the engine reads.
type ChatRequest struct {
	// Model is the requested model name.
	Model string `json:"model"`
	// Messages is the conversation.
	Messages []Message `json:"messages"`
	// Stream asks for server-sent events.
	Stream bool `json:"stream"`
	// StreamOptions tunes the stream.
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	// MaxTokens bounds the answer.
	MaxTokens *int `json:"max_tokens,omitempty"`
	// MaxCompletionTokens is the newer name of MaxTokens; it wins.
	MaxCompletionTokens *int `json:"max_completion_tokens,omitempty"`
	// CacheSalt separates the request's cached prefix from other salts'
	// (vLLM's and SGLang's cache_salt).
	CacheSalt string `json:"cache_salt,omitempty"`

	// Raw holds every top-level field of the body, for a flavour's extras
	// (SGLang's "rid", vLLM's "request_id").
	Raw map[string]json.RawMessage `json:"-"`
	// ID is the request's ID, set by Flavour.PrepareChat; Engine.Abort
	// takes it.
	ID string `json:"-"`
	// ResponseModel is the "model" of the answer, set by PrepareChat.
	ResponseModel string `json:"-"`
}

// StreamOptions is OpenAI's stream_options.
type StreamOptions struct {
	// IncludeUsage asks for a final usage chunk.
	IncludeUsage bool `json:"include_usage"`
}

// Message is one chat message.
type Message struct {
	// Role is "system", "user", "assistant", "tool".
	Role string `json:"role"`
	// Content is a string, an array of parts, or null.
	Content json.RawMessage `json:"content"`
}

// Text is the message's text: the string, or the text parts joined by
// spaces.
func (m Message) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		texts := make([]string, 0, len(parts))
		for _, p := range parts {
			if p.Text != "" {
				texts = append(texts, p.Text)
			}
		}
		return strings.Join(texts, " ")
	}
	return ""
}

// Limit is the answer bound the request asks for, or 0 for none.
func (r *ChatRequest) Limit() int {
	switch {
	case r.MaxCompletionTokens != nil:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		return *r.MaxTokens
	}
	return 0
}

// IncludeUsage reports stream_options.include_usage.
func (r *ChatRequest) IncludeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// LastUserText is the text of the last user message.
func (r *ChatRequest) LastUserText() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role == "user" {
			return r.Messages[i].Text()
		}
	}
	return ""
}

// DecodeChat parses and checks a chat body. Errors are *APIError of kind
// KindInvalidJSON or KindInvalidRequest.
func DecodeChat(body []byte) (*ChatRequest, error) {
	if !json.Valid(body) {
		return nil, &APIError{Kind: KindInvalidJSON, Message: "request body is not valid JSON"}
	}
	var req ChatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &APIError{Kind: KindInvalidRequest, Message: fmt.Sprintf("invalid request: %v", err)}
	}
	if err := json.Unmarshal(body, &req.Raw); err != nil {
		return nil, &APIError{Kind: KindInvalidRequest, Message: "request body must be a JSON object"}
	}
	if len(req.Messages) == 0 {
		return nil, &APIError{Kind: KindInvalidRequest, Message: "messages must be a non-empty array"}
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			return nil, &APIError{Kind: KindInvalidRequest, Message: fmt.Sprintf("messages[%d].role is required", i)}
		}
	}
	for _, p := range []*int{req.MaxTokens, req.MaxCompletionTokens} {
		if p != nil && *p < 1 {
			return nil, &APIError{Kind: KindInvalidRequest, Message: "max_tokens must be at least 1"}
		}
	}
	return &req, nil
}

// ChatMeta is what every piece of one answer repeats.
type ChatMeta struct {
	// ID is the answer's id ("chatcmpl-<request id>").
	ID string
	// Created is the answer's Unix time.
	Created int64
	// Model is the answer's "model".
	Model string
}

// ChatResult is a finished (or ended) answer.
type ChatResult struct {
	ChatMeta
	// Request is the request answered.
	Request *ChatRequest
	// Text is the content generated.
	Text string
	// FinishReason is "stop", "length", or "abort" (ended by Abort).
	FinishReason string
	// PromptTokens counts the prompt.
	PromptTokens int
	// CachedTokens counts the prompt tokens whose KV came from the
	// external KV cache instead of a prefill (Config.KVConnector).
	CachedTokens int
	// CompletionTokens counts the answer.
	CompletionTokens int
	// ToolCall is the function call the answer makes instead of text
	// (tools.go), nil for a text answer.
	ToolCall *ToolCall
}

// NewRequestID returns a random request ID (32 hex digits).
func NewRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ChatHandler serves a chat completion (POST /v1/chat/completions in most
// flavours): it checks the request, queues it for a slot, generates the
// deterministic answer token by token and writes it through the flavour,
// streamed or whole. A client that goes away stops it at once, wherever it
// is.
func (e *Engine) ChatHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.serveGen(w, r, false) })
}

// serveGen serves a chat completion, or a text completion when completions
// is true: the same generation, decoded and encoded for its endpoint.
func (e *Engine) serveGen(w http.ResponseWriter, r *http.Request, completions bool) {
	body, ok := e.readBody(w, r)
	if !ok {
		return
	}
	decode := DecodeChat
	if completions {
		decode = DecodeCompletion
	}
	req, err := decode(body)
	if !e.prepare(w, r, req, err) {
		return
	}
	var enc *answerEncoders
	if completions {
		enc = &answerEncoders{completions: true}
	}
	e.generate(w, r, req, enc)
}

// answerEncoders write one generation's answer in another API than the
// flavour's chat completions (text completions, or an engine's own
// Messages or Responses route); nil fields keep the flavour's.
type answerEncoders struct {
	completions bool
	// stream encodes a streamed answer.
	stream func(req *ChatRequest, meta ChatMeta) ChatStream
	// whole is the body of a finished non-streamed answer.
	whole func(res *ChatResult) any
	// idPrefix is the answer ID's prefix ("chatcmpl-" by default).
	idPrefix string
}

// generate runs one prepared request: it counts it, queues it for a slot,
// plans the answer (text, or a function call the request's tools allow)
// and writes it, streamed or whole.
func (e *Engine) generate(w http.ResponseWriter, r *http.Request, req *ChatRequest, enc *answerEncoders) {
	completions := enc != nil && enc.completions
	if req.Stream {
		e.streamed.Add(1)
	}
	prompt := countPromptTokens(req.Messages)
	g, end := e.begin(w, r, req, prompt, !req.Stream)
	defer end()
	if g == nil {
		return
	}
	g.completions = completions
	g.enc = enc
	prefix := idPrefix(completions)
	if enc != nil && enc.idPrefix != "" {
		prefix = enc.idPrefix
	}
	res := &ChatResult{
		ChatMeta:     ChatMeta{ID: prefix + req.ID, Created: time.Now().Unix(), Model: req.ResponseModel},
		Request:      req,
		FinishReason: "stop",
		PromptTokens: prompt,
	}
	if kv := e.cfg.KVConnector; kv != nil {
		// The prefill: what the cache holds is loaded, the rest computed,
		// and the prompt's chunks stored for the next request.
		// The chunks are keyed by the tokens alone, as LMCache's are with
		// both engines today (LMCache/LMCache#2878, #4825): a cache_salt
		// does not separate them.
		pt := promptTokenList(req.Messages)
		cached := min(kv.Lookup("", pt), prompt)
		kv.Store("", pt)
		if e.cfg.ReportCachedTokens {
			res.CachedTokens = cached
		}
	}
	toks := e.plan(req, res)
	if req.Stream {
		g.stream(w, req, res, toks)
	} else {
		g.complete(w, res, toks)
	}
}

// readBody reads a request's body, bounded; false when it answered (the
// model is loading, the body is too large) or the client went away.
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if e.Phase() == PhaseLoading {
		e.flavour.WriteError(w, KindLoading, "model is loading")
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil {
		return nil, false // the client went away while sending
	}
	if len(body) > maxBodyBytes {
		e.flavour.WriteError(w, KindInvalidRequest, "request body too large")
		return nil, false
	}
	return body, true
}

// prepare checks a decoded request (err is the decoder's) with the flavour
// and completes its ID and answering model; false when it answered the
// refusal.
func (e *Engine) prepare(w http.ResponseWriter, r *http.Request, req *ChatRequest, err error) bool {
	if err == nil {
		err = e.flavour.PrepareChat(e, r, req)
	}
	if err != nil {
		var ae *APIError
		if !errors.As(err, &ae) {
			ae = &APIError{Kind: KindInvalidRequest, Message: err.Error()}
		}
		e.flavour.WriteError(w, ae.Kind, ae.Message)
		return false
	}
	if req.ID == "" {
		req.ID = NewRequestID()
	}
	if req.ResponseModel == "" {
		req.ResponseModel = e.cfg.ServedName
	}
	return true
}

// begin counts an accepted request of prompt tokens, makes it abortable
// (by its ID, at shutdown, and by its client's hang-up: noticed late when
// late and the flavour notices non-streamed hang-ups late) and waits for a
// slot. It returns the generation that runs it, nil when it answered an
// injected failure or the request ended while waiting, and end, which the
// handler defers in every case.
func (e *Engine) begin(w http.ResponseWriter, r *http.Request, req *ChatRequest, prompt int, late bool) (*generation, func()) {
	e.total.Add(1)
	var undo []func()
	end := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	undo = append(undo, func() { e.finishRequest(r) }) // runs last
	e.promptTokens.Add(uint64(prompt))
	if e.takeFailure() {
		e.failed.Add(1)
		e.flavour.WriteError(w, KindEngineFailure, "fake engine failure")
		return nil, end
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	first := cancel
	undo = append(undo, func() { first(nil) })
	if poll := e.lateHangup(); poll > 0 && late {
		// The engine checks a non-streamed client only when poll passes
		// without any result (see lateHangup).
		ctx, cancel = context.WithCancelCause(context.WithoutCancel(r.Context()))
		second := cancel
		stop := make(chan struct{})
		undo = append(undo, func() { second(nil) }, func() { close(stop) })
		go e.noticeHangupLate(r.Context(), poll, stop, cancel)
	}
	stopOnEnd := context.AfterFunc(e.life, func() { cancel(errShutdown) })
	undo = append(undo, func() { stopOnEnd() })
	fl := &inflight{id: req.ID, cancel: cancel}
	e.inflightMu.Lock()
	e.inflight[fl] = struct{}{}
	e.inflightMu.Unlock()
	undo = append(undo, func() {
		e.inflightMu.Lock()
		delete(e.inflight, fl)
		e.inflightMu.Unlock()
	})
	if err := e.slots.acquire(ctx); err != nil {
		e.noteCancel(time.Now())
		return nil, end
	}
	g := &generation{e: e, ctx: ctx}
	undo = append(undo, g.release)
	return g, end
}

// plan lays out the answer's pieces and sets the finish reason: a
// function call's arguments when the request's tools call for one
// (tools.go), else text.
func (e *Engine) plan(req *ChatRequest, res *ChatResult) []string {
	if toks := e.planTool(req, res); toks != nil {
		return toks
	}
	n := e.cfg.Tokens
	if limit := req.Limit(); limit > 0 && limit < n {
		n = limit
		res.FinishReason = "length"
	}
	seed := e.cfg.Seed
	if e.cfg.WakeDrift {
		seed += uint64(e.wakes.Load())
	}
	toks := answerTokens(e.cfg.ServedName, req.LastUserText(), seed, n)
	toks = afterToolResult(req, toks)
	if e.cfg.BigChunkBytes > 0 {
		toks = append([]string{bigChunk(e.cfg.BigChunkBytes)}, toks...)
	}
	return toks
}

// generation is one request holding a slot.
type generation struct {
	e           *Engine
	ctx         context.Context
	released    bool
	completions bool            // a text completion (/v1/completions), not a chat one
	engineDead  bool            // the engine died under it (a collective gave up)
	streamed    bool            // its answer is streamed (StreamTokenRate applies)
	enc         *answerEncoders // another API's answer (nil: the flavour's chat)
}

// release gives the slot back (once).
func (g *generation) release() {
	if !g.released {
		g.released = true
		g.e.slots.release()
	}
}

// cancelled frees the slot at once and then counts the cancellation, so
// that a reader who sees the count also sees the slot free.
func (g *generation) cancelled(at time.Time) {
	g.release()
	g.e.noteCancel(at)
}

// aborted reports whether the generation was ended by Abort.
func (g *generation) aborted() bool { return errors.Is(context.Cause(g.ctx), errAborted) }

// run yields the pieces at the configured rate, calling emit for each. It
// stops when the context ends, when emit fails (the client is gone), or at
// the stall point, where it waits for the context. It returns true when
// every piece was emitted, else the time the end was observed.
func (g *generation) run(toks []string, emit func(tok string) bool) (bool, time.Time) {
	e, ctx := g.e, g.ctx
	rate := e.cfg.TokenRate
	if g.streamed && e.cfg.StreamTokenRate > 0 {
		rate = e.cfg.StreamTokenRate
	}
	var tick *time.Ticker
	if rate > 0 {
		tick = time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
	}
	if e.groupStuck() {
		// The model step is a collective over every rank: it waits for
		// the lost one until the engine gives up, and the request fails
		// with the engine (vLLM's EngineDeadError, 500).
		e.startCollectiveTimeout()
		<-ctx.Done()
		g.engineDead = e.life.Err() != nil
		return false, time.Now()
	}
	for i, tok := range toks {
		if tick != nil {
			select {
			case <-ctx.Done():
				return false, time.Now()
			case <-tick.C:
			}
		} else if ctx.Err() != nil {
			return false, time.Now()
		}
		e.genTokens.Add(1)
		if !emit(tok) {
			return false, time.Now()
		}
		if s := e.cfg.StallAfterTokens; s > 0 && i+1 == s {
			<-ctx.Done()
			return false, time.Now()
		}
	}
	return true, time.Time{}
}

// complete generates the whole answer and writes it as one JSON body.
func (g *generation) complete(w http.ResponseWriter, res *ChatResult, toks []string) {
	var sb strings.Builder
	ok, at := g.run(toks, func(tok string) bool {
		sb.WriteString(tok)
		res.CompletionTokens++
		return true
	})
	res.Text = sb.String()
	g.e.Activity() // a non-streamed answer is one result, posted at its end
	switch {
	case ok:
		g.release()
		g.e.completed.Add(1)
	case g.aborted():
		g.cancelled(at)
		res.FinishReason = "abort"
	case g.engineDead:
		g.cancelled(at)
		g.e.flavour.WriteError(w, KindEngineFailure, "EngineCore encountered an issue. See stack trace (above) for the root cause.")
		return
	default:
		g.cancelled(at)
		return
	}
	if g.completions {
		WriteJSON(w, http.StatusOK, CompletionResponse(res))
		return
	}
	if g.enc != nil && g.enc.whole != nil {
		WriteJSON(w, http.StatusOK, g.enc.whole(res))
		return
	}
	WriteJSON(w, http.StatusOK, g.e.flavour.ChatResponse(res))
}

// stream generates the answer as server-sent events, flushing each.
func (g *generation) stream(w http.ResponseWriter, req *ChatRequest, res *ChatResult, toks []string) {
	g.streamed = true
	rc := http.NewResponseController(w)
	enc := g.e.flavour.ChatStream(req, res.ChatMeta)
	switch {
	case g.completions:
		enc = &CompletionStream{Meta: res.ChatMeta, UsageChunk: req.IncludeUsage()}
	case g.enc != nil && g.enc.stream != nil:
		enc = g.enc.stream(req, res.ChatMeta)
	}
	emit := enc.Token
	if res.ToolCall != nil {
		emit = toolEmitter(enc, res.ToolCall)
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(b []byte) bool {
		g.e.Activity() // each streamed piece is a result the engine posts
		if len(b) > 0 {
			if _, err := w.Write(b); err != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
	if !send(enc.Open()) {
		g.cancelled(time.Now())
		return
	}
	var sb strings.Builder
	ok, at := g.run(toks, func(tok string) bool {
		sb.WriteString(tok)
		res.CompletionTokens++
		return send(emit(tok))
	})
	res.Text = sb.String()
	if !ok {
		g.cancelled(at)
		if g.aborted() {
			res.FinishReason = "abort"
			send(enc.Close(res))
		}
		return
	}
	g.release()
	if send(enc.Close(res)) {
		g.e.completed.Add(1)
		if g.e.closesAfterStream() {
			closeAfterAnswer(rc)
		}
	} else {
		g.e.noteCancel(time.Now())
	}
}

// lateHangup is how often the engine checks whether the client of a
// non-streamed request is still there, and then only when no result was
// posted for that long: 0 when it notices at once. llama-server b4748 waits
// for results in one-second waits that any result restarts (another
// request's token, a /slots or /metrics call), so under load an abandoned
// non-streamed request runs to max_tokens (llamaserver-observed.md,
// "Cancellation").
func (e *Engine) lateHangup() time.Duration {
	if l, ok := e.flavour.(interface{ NonStreamedHangupPoll() time.Duration }); ok {
		return l.NonStreamedHangupPoll()
	}
	return 0
}

// noticeHangupLate cancels a non-streamed request whose client went away,
// at the first poll that finds no result posted for poll.
func (e *Engine) noticeHangupLate(client context.Context, poll time.Duration, stop <-chan struct{}, cancel context.CancelCauseFunc) {
	select {
	case <-client.Done():
	case <-stop:
		return
	}
	for {
		quiet := time.Duration(time.Now().UnixNano() - e.activity.Load())
		if quiet >= poll {
			cancel(context.Canceled)
			return
		}
		t := time.NewTimer(poll - quiet)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return
		}
	}
}

// Activity marks a result posted outside a generation (llama-server's
// /slots and /metrics answers are results too).
func (e *Engine) Activity() { e.activity.Store(time.Now().UnixNano()) }

// closesAfterStream reports whether the engine closes the connection after
// a streamed answer (the knob, or a flavour that always does).
func (e *Engine) closesAfterStream() bool {
	if e.cfg.CloseAfterStream {
		return true
	}
	c, ok := e.flavour.(interface{ ClosesAfterStream() bool })
	return ok && c.ClosesAfterStream()
}

// closeAfterAnswer ends a complete chunked answer and closes its
// connection without telling the client first: the head said keep-alive,
// the body's last chunk arrives, then the FIN. That is what llama-server
// b4748 does; a client that pools the connection finds it closed when it
// sends the next request.
func closeAfterAnswer(rc *http.ResponseController) {
	conn, bw, err := rc.Hijack()
	if err != nil {
		return
	}
	_, _ = bw.WriteString("0\r\n\r\n")
	_ = bw.Flush()
	_ = conn.Close()
}

// noteCancel counts a cancellation observed at a time.
func (e *Engine) noteCancel(at time.Time) {
	e.lastCancel.Store(at.UnixNano())
	e.cancelled.Add(1)
}

// takeFailure consumes one injected failure, if any is left.
func (e *Engine) takeFailure() bool {
	for {
		n := e.failLeft.Load()
		if n <= 0 {
			return false
		}
		if e.failLeft.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// finishRequest counts a finished chat request and applies crash-after:
// under Serve the engine exits once the connection of the last request is
// done with its answer (see Serve's ConnState), so the client gets it whole;
// otherwise at once.
func (e *Engine) finishRequest(r *http.Request) {
	n := e.finished.Add(1)
	if c := e.cfg.CrashAfter; c <= 0 || n != uint64(c) {
		return
	}
	if conn, ok := r.Context().Value(connKey{}).(net.Conn); ok {
		e.crashConn.Store(&conn)
		return
	}
	e.crash()
}

// crash ends the engine as the crash-after knob asks.
func (e *Engine) crash() {
	e.exit(&ExitError{Code: 1, Reason: fmt.Sprintf("crash after %d requests", e.cfg.CrashAfter)})
}

// connKey carries a request's connection in its context (Serve only).
type connKey struct{}

// Abort ends the in-flight requests with that ID (waiting or generating),
// as an engine's abort route does, and returns how many there were. An
// aborted answer ends with finish reason "abort" if the client is there.
func (e *Engine) Abort(id string) int {
	e.inflightMu.Lock()
	defer e.inflightMu.Unlock()
	n := 0
	for fl := range e.inflight {
		if fl.id == id {
			fl.cancel(errAborted)
			n++
		}
	}
	return n
}

// AbortAll ends every in-flight request and returns how many there were.
func (e *Engine) AbortAll() int {
	e.inflightMu.Lock()
	defer e.inflightMu.Unlock()
	for fl := range e.inflight {
		fl.cancel(errAborted)
	}
	return len(e.inflight)
}

// WriteJSON writes v as a JSON answer with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}
