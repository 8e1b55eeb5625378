// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// targets caches parsed engine URLs.
var targets sync.Map // base+path -> engineTarget

func engineURL(base, path string) (engineTarget, error) {
	key := base + path
	if v, ok := targets.Load(key); ok {
		return v.(engineTarget), nil
	}
	t, err := parseEngineURL(base, path)
	if err == nil {
		targets.Store(key, t)
	}
	return t, err
}

// forward sends the request to the engine and relays the answer.
func (q *request) forward() {
	ep := &q.target.Endpoint
	path := ep.ChatPath
	if path == "" {
		path = "/v1/chat/completions"
	}
	if q.api == structs.APIDecisions {
		path = ep.DecisionsPath
		if path == "" {
			path = decisions.Path
		}
	}
	t, err := engineURL(ep.BaseURL, path)
	if err != nil {
		q.place.Done()
		q.place = nil
		q.fail(structs.Wrap(structs.CodeInternal, err, "engine endpoint of %s", q.target.Instance))
		return
	}
	body, err := q.engineBody()
	if err != nil {
		q.place.Done()
		q.place = nil
		q.fail(structs.Errf(structs.CodeInvalidRequest, "the request body is not a JSON object: %v", err))
		return
	}
	var extra []byte
	if ep.AuthHeader != "" && headerSafe(ep.AuthHeader, ep.AuthValue) {
		extra = append(extra, ep.AuthHeader...)
		extra = append(extra, ": "...)
		extra = append(extra, ep.AuthValue...)
		extra = append(extra, "\r\n"...)
	}
	if ep.RequestIDHeader != "" && headerSafe(ep.RequestIDHeader, "") {
		extra = append(extra, ep.RequestIDHeader...)
		extra = append(extra, ": "...)
		extra = append(extra, q.id...)
		extra = append(extra, "\r\n"...)
	}

	ctx, cancel := context.WithCancelCause(q.r.Context())
	defer cancel(nil)
	var contentSeen atomic.Bool
	watch := time.AfterFunc(max(q.deadlineLeft(), 0), func() {
		if contentSeen.Load() {
			cancel(errStreamIdle)
		} else {
			cancel(errDeadline)
		}
	})
	defer watch.Stop()

	q.forwardAt = time.Now()
	call, err := q.rt.engine.do(ctx, t, extra, body)
	if err != nil {
		cause := q.cause(ctx)
		switch {
		case cause == errClientGone:
			q.cut(call.Sent, false)
			q.gone()
		case cause == errDeadline:
			q.cut(call.Sent, false)
			q.outcome = OutcomeDeadline
			q.fail(structs.Errf(structs.CodeDeadlineExceeded, "model %q gave no output within the request deadline (%s)", q.model, q.b.deadline))
		default:
			q.cut(call.Sent, false)
			q.outcome = OutcomeEngineError
			q.fail(structs.Errf(structs.CodeUnavailable, "the engine of %s did not answer: %v", q.target.Instance, err))
		}
		return
	}
	q.headAt = time.Now()
	resp := call.Resp
	if resp.StatusCode >= 400 {
		q.engineStatusError(call)
		return
	}
	if q.api == structs.APIChat && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		q.relaySSE(ctx, cancel, call, &contentSeen, watch)
		return
	}
	q.relayJSON(ctx, call)
}

// headerSafe refuses header names and values that would break the request.
func headerSafe(name, value string) bool {
	return !strings.ContainsAny(name, "\r\n: ") && !strings.ContainsAny(value, "\r\n")
}

// cause says why the engine request's context ended.
func (q *request) cause(ctx context.Context) error {
	if q.r.Context().Err() != nil {
		return errClientGone
	}
	return context.Cause(ctx)
}

// cut ends the request's place after the router cut it. sent says whether
// the engine may have the request; started whether it had answered any of
// it. The place stays held until there is evidence the engine stopped.
func (q *request) cut(sent, started bool) {
	p := q.place
	if p == nil {
		return
	}
	q.place = nil
	if !sent {
		p.Done()
		return
	}
	fallback := admission.SettleAtStop
	if started {
		fallback = admission.SettleWhenIdle
	}
	if q.target.Endpoint.AbortByID && q.rt.req != nil {
		pe := p.Cut(admission.SettleOnAbort)
		go q.rt.abort(pe, q.target.Instance, q.id, fallback)
		return
	}
	p.Cut(fallback)
}

// done frees the place of a request the engine finished.
func (q *request) done() {
	if q.place != nil {
		q.place.Done()
		q.place = nil
	}
}

// engineBody is the body sent to the engine: the engine's served name,
// always streamed with usage (chat), and the request ID where the engine
// takes it in the body.
func (q *request) engineBody() ([]byte, error) {
	ep := &q.target.Endpoint
	needModel := ep.ServedName != "" && ep.ServedName != q.model
	needRid := ep.RequestIDField != ""
	needStream := q.api == structs.APIChat && (!q.stream || !q.usageOpt)
	if !needModel && !needRid && !needStream {
		return q.body, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(q.body, &m); err != nil {
		return nil, err
	}
	if needModel {
		m["model"], _ = json.Marshal(ep.ServedName)
	}
	if needRid {
		m[ep.RequestIDField], _ = json.Marshal(q.id)
	}
	if needStream {
		m["stream"] = json.RawMessage("true")
		so := map[string]json.RawMessage{}
		if raw, ok := m["stream_options"]; ok {
			_ = json.Unmarshal(raw, &so)
			if so == nil {
				so = map[string]json.RawMessage{}
			}
		}
		so["include_usage"] = json.RawMessage("true")
		m["stream_options"], _ = json.Marshal(so)
	}
	return json.Marshal(m)
}

// engineStatusError answers an engine's error status: 400 engine_rejected
// for a refused request (the engine is done with it), 502 engine_error for
// a failure (the model keeps serving; the place settles on the engine's
// idle reading).
func (q *request) engineStatusError(call *engineCall) {
	resp := call.Resp
	msg, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	reusable := false
	if err == nil {
		var one [1]byte
		n, rerr := resp.Body.Read(one[:])
		reusable = n == 0 && rerr == io.EOF
	}
	call.finish(reusable)
	q.endAt = time.Now()
	text := engineMessage(msg, resp.StatusCode)
	switch resp.StatusCode {
	case 400, 413, 422:
		q.done()
		q.outcome = OutcomeEngineRejected
		q.fail(structs.Errf(structs.CodeEngineRejected, "%s", text).WithDetail("engine_status", resp.StatusCode))
	default:
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "%s", text).WithDetail("engine_status", resp.StatusCode))
	}
}

// engineMessage extracts the engine's own error message.
func engineMessage(body []byte, status int) string {
	var env struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil {
		if len(env.Error) > 0 {
			var inner struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(env.Error, &inner) == nil && inner.Message != "" {
				return inner.Message
			}
			var s string
			if json.Unmarshal(env.Error, &s) == nil && s != "" {
				return s
			}
		}
		if env.Message != "" {
			return env.Message
		}
		if s, ok := env.Detail.(string); ok && s != "" {
			return s
		}
	}
	if b := bytes.TrimSpace(body); len(b) > 0 {
		return string(b)
	}
	return "the engine answered HTTP " + strconv.Itoa(status)
}

// engineErrorCode reads the HTTP-like code of an in-stream engine error
// ({"error":{"code":400,...}}), 0 when it has none.
func engineErrorCode(payload []byte) int {
	var env struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
		Code any `json:"code"`
	}
	if json.Unmarshal(payload, &env) != nil {
		return 0
	}
	for _, c := range []any{env.Error.Code, env.Code} {
		switch v := c.(type) {
		case float64:
			return int(v)
		case string:
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return 0
}

// relaySSE relays (or aggregates) a chat answer streamed by the engine.
func (q *request) relaySSE(ctx context.Context, cancel context.CancelCauseFunc, call *engineCall, contentSeen *atomic.Bool, watch *time.Timer) {
	sr := newSSEReader(call.Resp.Body, q.b.maxChunk)
	defer sr.release()
	var agg *aggregate
	if !q.stream {
		agg = newAggregate()
	}
	rw := rewriter{newID: q.id, public: q.model, served: q.target.Endpoint.ServedName}
	var (
		cutErr    error
		engineErr []byte
		sawDone   bool
		finished  bool
		wrote     bool
		trailer   bool
	)
	if q.stream {
		q.setWriteDeadline()
	}
	for {
		ev, err := sr.next()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
			case errors.Is(err, errTooLarge):
				cancel(errChunk)
				cutErr = errChunk
			default:
				if sawDone || (finished && engineErr == nil) {
					break // the answer is complete; only the end of the body is missing
				}
				if c := q.cause(ctx); c != nil {
					cutErr = c
				} else {
					cutErr = err
				}
			}
			break
		}
		kind, payload := classify(ev)
		switch kind {
		case evComment:
		case evDone:
			sawDone = true
		case evError:
			if engineErr == nil && !sawDone {
				engineErr = append([]byte(nil), payload...)
			}
		case evData:
			if sawDone || engineErr != nil {
				continue
			}
			relay := true
			if agg != nil {
				relay = false
				agg.add(payload, q)
			} else {
				relay = q.scan(payload, &rw)
			}
			if agg != nil && agg.finished {
				finished = true
			}
			if q.firstContent.IsZero() && q.contentN > 0 {
				q.firstContent = time.Now()
				contentSeen.Store(true)
				watch.Reset(q.b.streamIdle)
			}
			if relay {
				if !q.headersSent {
					q.sseHeaders()
				}
				if err := q.writeEvent(payload, &rw); err != nil {
					cutErr = q.clientErr(cancel)
				}
				wrote = true
			}
		}
		if cutErr != nil {
			break
		}
		if (sawDone || engineErr != nil) && !trailer {
			trailer = true
			// The answer is complete: it reaches the client now, before the
			// engine's body is drained.
			if engineErr == nil {
				q.endAt = time.Now()
				if err := q.writeAnswer(agg); err != nil {
					cutErr = q.clientErr(cancel)
					break
				}
			}
			watch.Reset(time.Second)
		}
		if !sr.buffered() {
			if wrote && q.stream {
				wrote = false
				if err := q.flush(); err != nil {
					cutErr = q.clientErr(cancel)
					break
				}
				q.setWriteDeadline()
			}
			if !contentSeen.Load() {
				continue
			}
			if !trailer {
				watch.Reset(q.b.streamIdle)
			}
		}
	}
	watch.Stop()
	if q.endAt.IsZero() {
		q.endAt = time.Now()
	}
	switch {
	case cutErr != nil:
		call.finish(false)
		q.cutEnd(cutErr)
	case engineErr != nil:
		call.finish(sr.eof)
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		code := structs.CodeEngineError
		q.outcome = OutcomeEngineError
		if c := engineErrorCode(engineErr); (c == 400 || c == 413 || c == 422) && q.firstContent.IsZero() {
			code = structs.CodeEngineRejected
			q.outcome = OutcomeEngineRejected
		}
		q.fail(structs.Errf(code, "%s", engineMessage(engineErr, 0)))
	case !sawDone && !finished && !q.sawFinish:
		call.finish(false)
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "the engine ended its answer without finishing it"))
	default:
		call.finish(sr.eof)
		q.done()
		if !trailer {
			q.endAt = time.Now()
			if err := q.writeAnswer(agg); err != nil {
				q.outcome = OutcomeCancelled
			}
		}
	}
}

// clientErr ends the engine work after a failed write to the client: the
// client went away, or read nothing within the client read bound.
func (q *request) clientErr(cancel context.CancelCauseFunc) error {
	// IMPORTANT: net/http cancels the request's context on any failed
	// write, a write deadline included: look at the error first.
	if !errors.Is(q.writeErr, os.ErrDeadlineExceeded) && q.r.Context().Err() != nil {
		cancel(errClientGone)
		return errClientGone
	}
	cancel(errClientIdle)
	return errClientIdle
}

// cutEnd settles and answers a request the router cut.
func (q *request) cutEnd(cause error) {
	q.cut(true, !q.headAt.IsZero())
	switch cause {
	case errClientGone:
		q.gone()
	case errClientIdle:
		q.outcome = OutcomeClientIdle
		q.code = OutcomeClientIdle
	case errDeadline:
		q.outcome = OutcomeDeadline
		q.fail(structs.Errf(structs.CodeDeadlineExceeded, "model %q gave no output within the request deadline (%s)", q.model, q.b.deadline))
	case errStreamIdle:
		q.outcome = OutcomeStreamIdle
		q.fail(structs.Errf(structs.CodeStreamStalled, "model %q sent nothing for %s (limits.stream_idle)", q.model, q.b.streamIdle))
	case errChunk:
		q.outcome = OutcomeChunkTooLarge
		q.fail(structs.Errf(structs.CodeChunkTooLarge, "the engine sent one piece of the answer larger than %d bytes (limits.max_chunk_bytes)", q.b.maxChunk))
	default:
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "the engine's answer broke off: %v", cause))
	}
}

// writeEvent relays one chunk with CapyCTL's request ID and the public
// model name.
func (q *request) writeEvent(payload []byte, rw *rewriter) error {
	if err := q.write(dataPrefix); err != nil {
		return err
	}
	if err := rw.write(q, payload); err != nil {
		return err
	}
	return q.write(eventEnd)
}

var (
	dataPrefix = []byte("data: ")
	eventEnd   = []byte("\n\n")
	doneEvent  = []byte("data: [DONE]\n\n")
)

// writeAnswer ends a complete answer: the metrics comment and [DONE] for a
// stream, the aggregated JSON for a client that asked for none.
func (q *request) writeAnswer(agg *aggregate) error {
	q.setWriteDeadline()
	if agg == nil {
		if !q.headersSent {
			q.sseHeaders()
		}
		b := make([]byte, 0, 512)
		b = append(b, ": x-capyctl-metrics "...)
		b = q.appendMetrics(b)
		b = append(b, "\n\n"...)
		b = append(b, doneEvent...)
		if err := q.write(b); err != nil {
			return err
		}
		return q.flush()
	}
	out := agg.json(q)
	h := q.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	q.w.WriteHeader(200)
	q.status = 200
	q.headersSent = true
	return q.write(out)
}

// scan reads what the router needs from a streamed chunk (first content,
// usage, finish) and says whether to relay it: a usage-only chunk the
// client did not ask for is dropped.
func (q *request) scan(payload []byte, rw *rewriter) bool {
	if rw.oldID == "" || q.contentN == 0 {
		var c chunkHead
		if json.Unmarshal(payload, &c) == nil {
			if rw.oldID == "" && c.ID != "" {
				rw.setOldID(c.ID)
			}
			for _, ch := range c.Choices {
				if ch.Delta.hasContent() {
					q.contentN++
					q.lastContent = time.Now()
				}
				if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
					q.sawFinish = true
				}
			}
			if len(c.Usage) > 0 && string(c.Usage) != "null" {
				q.usage.parse(c.Usage)
				if len(c.Choices) == 0 && !q.usageOpt {
					return false
				}
			}
			if len(c.Timings) > 0 {
				q.timings.parse(c.Timings)
			}
			return true
		}
	}
	q.contentN++
	q.lastContent = time.Now()
	if bytes.Contains(payload, usageKey) || bytes.Contains(payload, finishKey) || bytes.Contains(payload, timingsKey) {
		var c chunkHead
		if json.Unmarshal(payload, &c) == nil {
			empty := true
			for _, ch := range c.Choices {
				if ch.Delta.hasContent() {
					empty = false
				}
				if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
					q.sawFinish = true
				}
			}
			if empty {
				q.contentN--
			}
			if len(c.Timings) > 0 {
				q.timings.parse(c.Timings)
			}
			if len(c.Usage) > 0 && string(c.Usage) != "null" {
				q.usage.parse(c.Usage)
				if len(c.Choices) == 0 && !q.usageOpt {
					return false
				}
			}
		}
	}
	return true
}

var (
	usageKey   = []byte(`"usage"`)
	finishKey  = []byte(`"finish_reason":"`)
	timingsKey = []byte(`"timings"`)
)

// relayJSON relays a whole JSON answer (a decision, or a chat engine that
// does not stream) with the request ID, the public model name and
// capyctl.metrics.
func (q *request) relayJSON(ctx context.Context, call *engineCall) {
	data, err := io.ReadAll(io.LimitReader(call.Resp.Body, 64<<20))
	if err != nil {
		call.finish(false)
		q.endAt = time.Now()
		c := q.cause(ctx)
		if c == nil {
			c = err
		}
		q.cutEnd(c)
		return
	}
	call.finish(true)
	q.endAt = time.Now()
	q.firstContent = q.endAt
	q.done()
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		q.status = 200
		q.headersSent = true
		h := q.w.Header()
		h.Set("Content-Type", call.Resp.Header.Get("Content-Type"))
		q.w.WriteHeader(200)
		_ = q.write(data)
		return
	}
	m["id"], _ = json.Marshal(q.id)
	if _, ok := m["model"]; ok || q.api == structs.APIDecisions {
		m["model"], _ = json.Marshal(q.model)
	}
	if u, ok := m["usage"]; ok {
		q.usage.parse(u)
	}
	if t, ok := m["timings"]; ok {
		q.timings.parse(t)
	}
	delete(m, "rid")
	q.contentN = q.usage.completion
	cap := append([]byte(`{"metrics":`), q.appendMetrics(nil)...)
	m["capyctl"] = append(cap, '}')
	out, _ := json.Marshal(m)
	out = append(out, '\n')
	q.setWriteDeadline()
	h := q.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	q.w.WriteHeader(200)
	q.status = 200
	q.headersSent = true
	_ = q.write(out)
}

// rewriter replaces the engine's answer ID with CapyCTL's request ID and
// the served model name with the public one, without decoding the chunk.
type rewriter struct {
	newID, public, served string
	oldID                 string
	pairs                 [][2][]byte
}

func (rw *rewriter) setOldID(id string) {
	rw.oldID = id
	rw.build()
}

func (rw *rewriter) build() {
	rw.pairs = rw.pairs[:0]
	q := func(s string) []byte { b, _ := json.Marshal(s); return b }
	if rw.oldID != "" && rw.oldID != rw.newID {
		for _, sep := range []string{":", ": "} {
			rw.pairs = append(rw.pairs, [2][]byte{
				append([]byte(`"id"`+sep), q(rw.oldID)...),
				append([]byte(`"id"`+sep), q(rw.newID)...),
			})
		}
	}
	if rw.served != "" && rw.served != rw.public {
		for _, sep := range []string{":", ": "} {
			rw.pairs = append(rw.pairs, [2][]byte{
				append([]byte(`"model"`+sep), q(rw.served)...),
				append([]byte(`"model"`+sep), q(rw.public)...),
			})
		}
	}
}

// write writes payload with the replacements.
func (rw *rewriter) write(q *request, payload []byte) error {
	if rw.pairs == nil && rw.served != "" && rw.served != rw.public {
		rw.build()
	}
	rest := payload
	for len(rest) > 0 {
		at, which := -1, -1
		for i, p := range rw.pairs {
			if j := bytes.Index(rest, p[0]); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			return q.write(rest)
		}
		if err := q.write(rest[:at]); err != nil {
			return err
		}
		if err := q.write(rw.pairs[which][1]); err != nil {
			return err
		}
		rest = rest[at+len(rw.pairs[which][0]):]
	}
	return nil
}
