// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// targetCache caches parsed engine URLs for one Router. It is bounded:
// engine endpoints come and go with instances (a fresh port per start), so
// a cache that only grows would keep every endpoint a long-lived role ever
// used; past maxTargets entries it starts over. A sync.Map keeps the hit,
// taken on every request, free of locks.
type targetCache struct {
	m sync.Map     // base+path -> engineTarget
	n atomic.Int64 // entries stored since the last reset
}

// maxTargets bounds a targetCache: far above the endpoints live at once on
// one role (instances × API paths).
const maxTargets = 1024

func (c *targetCache) engineURL(base, path string) (engineTarget, error) {
	key := base + path
	if v, ok := c.m.Load(key); ok {
		return v.(engineTarget), nil
	}
	t, err := parseEngineURL(base, path)
	if err != nil {
		return t, err
	}
	if c.n.Add(1) > maxTargets {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(key, t)
	return t, nil
}

// len counts the cached targets.
func (c *targetCache) len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}

// forward sends the request to the engine and reads the answer's head.
// It returns nil when the request was answered already (refused, cut or
// failed); serve then relays the answer. IMPORTANT: the relay does not run
// inside forward, so that forward's frame is not on the handler's stack for
// the stream's life (see sseLoop).
func (q *request) forward() *engineCall {
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
	t, err := q.rt.targets.engineURL(ep.BaseURL, path)
	if err != nil {
		q.place.Done()
		q.place = nil
		q.fail(structs.Wrap(structs.CodeInternal, err, "engine endpoint of %s", q.target.Instance))
		return nil
	}
	body, err := q.engineBody()
	if err != nil {
		q.place.Done()
		q.place = nil
		q.fail(structs.Errf(structs.CodeInvalidRequest, "the request body is not a JSON object: %v", err))
		return nil
	}
	// A body rewritten for the engine is a new copy, and the client's is
	// dropped: the copy counts against the role's bound of bodies in flight
	// in its place (what it holds beyond the client's buffer, which serve
	// gives back after the send) until the engine has it.
	var copyHeld int64
	if len(body) > 0 && len(q.body) > 0 && &body[0] != &q.body[0] {
		copyHeld = max(int64(cap(body))-q.bodyHeld, 0)
		if !q.rt.bodies.takeFor(copyHeld, int64(cap(body))) {
			q.place.Done()
			q.place = nil
			q.w.Header().Set("Retry-After", "1")
			q.fail(structs.Errf(structs.CodeBodiesInFlightFull,
				"the role holds %d bytes of request bodies, its bound (limits.max_body_bytes_in_flight); retry shortly", q.rt.cfg.MaxBodyBytesInFlight))
			return nil
		}
		q.body = nil // the copy replaces it
	}
	defer q.rt.bodies.give(copyHeld)
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

	// A hang-up cuts the engine request: the cutter closes its connection.
	q.stopGone = context.AfterFunc(q.r.Context(), q.clientGone)
	q.forwardAt = time.Now()
	call, err := q.rt.engine.do(q.r.Context(), t, extra, body, q.start.Add(q.b.deadline), &q.cutter)
	q.body = nil // the engine has it; a long stream need not keep it
	if err != nil {
		q.cut(call.Sent)
		switch q.cause(err) {
		case errClientGone:
			q.gone()
		case errDeadline:
			q.outcome = OutcomeDeadline
			q.fail(structs.Errf(structs.CodeDeadlineExceeded, "model %q gave no output within the request deadline (%s)", q.model, q.b.deadline))
		default:
			q.outcome = OutcomeEngineError
			q.fail(structs.Errf(structs.CodeUnavailable, "the engine of %s did not answer: %v", q.target.Instance, err))
		}
		return nil
	}
	q.headAt = time.Now()
	return call
}

// relay answers with the engine's answer: its error, its event stream, or
// its JSON.
func (q *request) relay(call *engineCall) {
	resp := call.Resp
	switch {
	case resp.StatusCode >= 400:
		q.engineStatusError(call)
	case q.api == structs.APIChat && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		q.relaySSE(newSSEReader(call, q.b.maxChunk), call)
	default:
		q.relayJSON(call)
	}
}

// clientGone is the hang-up callback (context.AfterFunc on the request's
// context).
func (q *request) clientGone() {
	q.cutter.cut(errClientGone)
}

// headerSafe refuses header names and values that would break the request.
func headerSafe(name, value string) bool {
	return !strings.ContainsAny(name, "\r\n: ") && !strings.ContainsAny(value, "\r\n")
}

// cause says why an engine call failed with err: the cut's cause (the
// client went away, a bound), a bound the connection's deadline enforced,
// or nil for a failure of the engine.
func (q *request) cause(err error) error {
	if q.clientWent() {
		return errClientGone
	}
	if c := q.cutter.err(); c != nil {
		return c
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		if q.firstContent.IsZero() {
			return errDeadline
		}
		return errStreamIdle
	}
	return nil
}

// cut ends the request's place after the router cut it. sent says whether
// the engine may have the request (it was written whole). A request the engine never had frees
// its place at once. One it may have holds the place until there is
// evidence the engine is done with it: the engine's answer to an abort by
// request ID where it has one, else its load reading showing no more
// requests than CapyCTL still serves there (settleLoop); only an engine
// without a load reading makes it wait for the next stop. Whether the
// engine had answered any of it does not matter: a request the engine
// queued but never answered is counted in its load reading like one it
// answers.
func (q *request) cut(sent bool) {
	p := q.place
	if p == nil {
		return
	}
	q.place = nil
	if !sent {
		p.Done()
		return
	}
	if q.target.Endpoint.AbortByID && q.rt.req != nil {
		pe := p.Cut(admission.SettleOnAbort)
		go q.rt.abort(pe, q.target.Instance, q.id, admission.SettleWhenIdle)
		return
	}
	p.Cut(admission.SettleWhenIdle)
}

// done frees the place of a request the engine finished.
func (q *request) done() {
	if q.place != nil {
		q.place.Done()
		q.place = nil
	}
}

// engineBody is the body sent to the engine: the engine's served name,
// the request ID where the engine takes it in the body, and for chat a
// stream with usage (the router's figures come from it), except for a
// non-streamed request to an engine that stops one on a hang-up
// (ForwardNonStreamed), which goes as the client sent it.
func (q *request) engineBody() ([]byte, error) {
	ep := &q.target.Endpoint
	needModel := ep.ServedName != "" && ep.ServedName != q.model
	needRid := ep.RequestIDField != ""
	needStream := q.api == structs.APIChat && ((!q.stream && !ep.ForwardNonStreamed) || (q.stream && !q.usageOpt))
	if !needModel && !needRid && !needStream {
		return q.body, nil
	}
	// The body is spliced: its members are copied as the client wrote them,
	// those the router sets are written anew at the end (a member written
	// twice by the client is dropped twice: the router's value wins, as the
	// last one would).
	var buf [24]member
	ms, ok := topLevel(q.body, buf[:0])
	if !ok {
		return q.engineBodyDecoded(needModel, needRid, needStream)
	}
	out := make([]byte, 0, len(q.body)+len(q.id)+len(ep.ServedName)+64)
	out = append(out, '{')
	var opts []byte // the client's stream_options, the last one
	for _, m := range ms {
		k := m.key
		switch {
		case needModel && string(k) == "model",
			needRid && string(k) == ep.RequestIDField,
			needStream && string(k) == "stream":
			continue
		case needStream && string(k) == "stream_options":
			opts = q.body[m.val:m.end]
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, q.body[m.start:m.end]...)
	}
	if needModel {
		out = appendMember(out, "model")
		out = appendJSONString(out, ep.ServedName)
	}
	if needRid {
		out = appendMember(out, ep.RequestIDField)
		out = appendJSONString(out, q.id)
	}
	if needStream {
		out = appendMember(out, "stream")
		out = append(out, `true,"stream_options":{"include_usage":true`...)
		if len(opts) > 0 && opts[0] == '{' {
			var obuf [8]member
			oms, ok := topLevel(opts, obuf[:0])
			if !ok {
				return q.engineBodyDecoded(needModel, needRid, needStream)
			}
			for _, m := range oms {
				if string(m.key) != "include_usage" {
					out = append(out, ',')
					out = append(out, opts[m.start:m.end]...)
				}
			}
		}
		out = append(out, '}')
	}
	return append(out, '}'), nil
}

// appendMember appends `"name":` after a comma where one is needed.
func appendMember(b []byte, name string) []byte {
	if len(b) > 1 {
		b = append(b, ',')
	}
	b = appendJSONString(b, name)
	return append(b, ':')
}

// engineBodyDecoded is engineBody for a body the splice does not handle
// (a member name with an escape): decoded and encoded again.
func (q *request) engineBodyDecoded(needModel, needRid, needStream bool) ([]byte, error) {
	ep := &q.target.Endpoint
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

// sseState is what the relay has learned of a streamed answer.
type sseState struct {
	sr        *sseReader
	call      *engineCall
	agg       *aggregate // the answer so far, for a client that asked for no stream
	rw        rewriter
	cutErr    error  // why the router cut the answer
	engineErr []byte // the engine's error event
	sawDone   bool   // [DONE] arrived
	finished  bool   // the aggregate saw a finish reason
	wrote     bool   // bytes were written since the last flush
	trailer   bool   // the answer's end was written to the client
}

// relaySSE relays (or aggregates) a chat answer streamed by the engine.
// A stream that goes on after its first flush is taken over from net/http
// (hijack.go) and handed off: the handler returns, and relayOn relays the
// rest on a goroutine of its own.
func (q *request) relaySSE(sr *sseReader, call *engineCall) {
	st := &sseState{sr: sr, call: call, rw: rewriter{newID: q.id, public: q.model, served: q.target.Endpoint.ServedName}}
	if q.stream {
		q.setWriteDeadline()
	} else {
		st.agg = newAggregate()
	}
	if q.sseLoop(st) {
		q.st, q.handedOff = st, true
		return
	}
	q.sseEnd(st)
	sr.release()
}

// sseLoop relays the engine's events until its stream ends or is cut. It
// returns true, on the handler's goroutine only, once the stream was taken
// over and must be handed off.
//
// IMPORTANT: every open stream pays for the stack of the goroutine this
// loop waits on. Keep the loop's frame small and rare work out of line
// (sseEvent, sseEnd), and decode JSON one level at a time (decodeChunk).
func (q *request) sseLoop(st *sseState) bool {
	sr := st.sr
	for {
		ev, err := sr.next()
		if err != nil {
			q.sseReadErr(st, err)
			return false
		}
		q.sseEvent(st, sr, ev)
		if st.cutErr != nil {
			return false
		}
		if (st.sawDone || st.engineErr != nil) && !st.trailer {
			if q.sseComplete(st, sr); st.cutErr != nil {
				return false
			}
		}
		if !sr.buffered() {
			if st.wrote && q.stream {
				st.wrote = false
				if q.wantsTakeOver(st) && !q.takeOver() {
					// flush hands a pending head to net/http; a head net/http
					// wrote stays there.
					q.headViaHTTP = false
				}
				if err := q.flush(); err != nil {
					st.cutErr = q.clientErr()
					return false
				}
				q.setWriteDeadline()
			}
			if !q.firstContent.IsZero() && !st.trailer {
				sr.readWithin(q.b.streamIdle)
			}
			if q.cc != nil && !q.handedOff {
				return true
			}
		}
	}
}

// sseReadErr records why the engine's stream ended.
func (q *request) sseReadErr(st *sseState, err error) {
	switch {
	case errors.Is(err, io.EOF):
	case errors.Is(err, errTooLarge):
		q.cutter.cut(errChunk)
		st.cutErr = errChunk
	default:
		if st.sawDone || (st.finished && st.engineErr == nil) {
			return // the answer is complete; only the end of the body is missing
		}
		if c := q.cause(err); c != nil {
			st.cutErr = c
		} else {
			st.cutErr = err
		}
	}
}

// sseEvent handles one event of the engine's stream.
func (q *request) sseEvent(st *sseState, sr *sseReader, ev []byte) {
	kind, payload := classify(ev)
	switch kind {
	case evComment:
	case evDone:
		st.sawDone = true
	case evError:
		if st.engineErr == nil && !st.sawDone {
			st.engineErr = append([]byte(nil), payload...)
		}
	case evData:
		if st.sawDone || st.engineErr != nil {
			return
		}
		relay := true
		if st.agg != nil {
			relay = false
			st.agg.add(payload, q)
			if st.agg.finished {
				st.finished = true
			}
		} else {
			relay = q.scan(payload, &st.rw)
		}
		if q.firstContent.IsZero() && q.contentN > 0 {
			// From the first output on, the stream idle bound replaces the
			// request deadline.
			q.firstContent = time.Now()
			sr.readWithin(q.b.streamIdle)
		}
		if relay {
			if !q.headersSent {
				q.sseHeaders()
			}
			if err := q.writeEvent(payload, &st.rw); err != nil {
				st.cutErr = q.clientErr()
			}
			st.wrote = true
		}
	}
}

// sseComplete writes the end of a complete answer: it reaches the client
// now, before the engine's body is drained (for a second at most).
func (q *request) sseComplete(st *sseState, sr *sseReader) {
	st.trailer = true
	if st.engineErr == nil {
		q.endAt = time.Now()
		if err := q.writeAnswer(st.agg); err != nil {
			st.cutErr = q.clientErr()
			return
		}
	}
	sr.readWithin(time.Second)
}

// sseEnd settles and answers the request once the engine's stream ended.
func (q *request) sseEnd(st *sseState) {
	sr, call := st.sr, st.call
	if q.endAt.IsZero() {
		q.endAt = time.Now()
	}
	switch {
	case st.cutErr != nil:
		call.finish(false)
		q.cutEnd(st.cutErr)
	case st.engineErr != nil:
		call.finish(sr.reusable())
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		code := structs.CodeEngineError
		q.outcome = OutcomeEngineError
		if c := engineErrorCode(st.engineErr); (c == 400 || c == 413 || c == 422) && q.firstContent.IsZero() {
			code = structs.CodeEngineRejected
			q.outcome = OutcomeEngineRejected
		}
		q.fail(structs.Errf(code, "%s", engineMessage(st.engineErr, 0)))
	case !st.sawDone && !st.finished && !q.sawFinish:
		call.finish(false)
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "the engine ended its answer without finishing it"))
	default:
		call.finish(sr.reusable())
		q.done()
		if !st.trailer {
			q.endAt = time.Now()
			if err := q.writeAnswer(st.agg); err != nil {
				q.outcome = OutcomeCancelled
			}
		}
	}
}

// clientErr ends the engine work after a failed write to the client: the
// client went away, or read nothing within the client read bound.
func (q *request) clientErr() error {
	// IMPORTANT: net/http cancels the request's context on any failed
	// write, a write deadline included: look at the error first.
	if !errors.Is(q.writeErr, os.ErrDeadlineExceeded) && q.clientWent() {
		q.cutter.cut(errClientGone)
		return errClientGone
	}
	q.cutter.cut(errClientIdle)
	return errClientIdle
}

// cutEnd settles and answers a request the router cut.
func (q *request) cutEnd(cause error) {
	q.cut(true)
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
	case errShutdown:
		q.outcome = OutcomeShutdown
		q.fail(structs.Errf(structs.CodeShuttingDown, "the role is shutting down and its drain timeout ended before the answer"))
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
// client did not ask for is dropped. Most chunks need no decoding: once
// the answer's ID and first content are known, a chunk without usage, a
// finish reason or timings is content. The few that need decoding are
// decoded by scanChunk, off the relay's goroutine for a stream taken over
// from net/http (see decodeOff).
func (q *request) scan(payload []byte, rw *rewriter) bool {
	if rw.oldID != "" && q.contentN > 0 && !bytes.Contains(payload, usageKey) &&
		!bytes.Contains(payload, finishKey) && !bytes.Contains(payload, timingsKey) {
		q.contentN++
		q.lastContent = time.Now()
		return true
	}
	if q.cc != nil {
		return q.decodeOff(payload, rw)
	}
	return q.scanChunk(payload, rw)
}

// decodeOff runs scanChunk on a goroutine of its own and waits for it.
// IMPORTANT: encoding/json needs several KiB of stack; a taken-over stream
// waits on a goroutine that starts at 2 KiB, and a stack that grew once
// stays grown until a collection shrinks it (only while the goroutine uses
// under a quarter of it). Decoding the stream's first chunks there would
// leave every open stream with a 4 to 8 KiB stack; the short-lived
// goroutine's stack is freed when it ends.
func (q *request) decodeOff(payload []byte, rw *rewriter) bool {
	done := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- panicked{p} // re-raised on the relay's goroutine
			}
		}()
		done <- q.scanChunk(payload, rw)
	}()
	v := <-done
	if p, ok := v.(panicked); ok {
		panic(p.v)
	}
	return v.(bool)
}

// panicked carries a panic from decodeOff's goroutine.
type panicked struct{ v any }

// scanChunk is scan for a chunk that may need decoding.
func (q *request) scanChunk(payload []byte, rw *rewriter) bool {
	if rw.oldID == "" || q.contentN == 0 {
		var c chunkHead
		if decodeChunk(payload, &c) == nil {
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
		if decodeChunk(payload, &c) == nil {
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

// relayJSON relays a whole JSON answer (a decision, or a chat answer the
// engine did not stream) with the request ID, the public model name and
// capyctl.metrics. The answer is spliced, not decoded and encoded again:
// one scan finds its top-level members (topLevel), only usage and timings
// are decoded, and the output is the engine's bytes with three members
// replaced or added.
func (q *request) relayJSON(call *engineCall) {
	data, err := readBody(call.Resp, 64<<20)
	if err != nil {
		call.finish(false)
		q.endAt = time.Now()
		c := q.cause(err)
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
	out, ok := q.spliceJSON(data)
	if !ok {
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
		out = q.rebuildJSON(m)
	}
	q.setWriteDeadline()
	h := q.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	q.w.WriteHeader(200)
	q.status = 200
	q.headersSent = true
	_ = q.write(out)
}

// readBody reads a whole answer body of at most limit bytes, sized by its
// Content-Length when it has one.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	if n := resp.ContentLength; n >= 0 && n <= limit {
		b := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}

// spliceJSON is the answer with its top-level "id" set to the request ID,
// "model" (where present, always for a decision) to the public name,
// "rid" removed and "capyctl" added; usage and timings are read. ok is
// false for an answer the splice does not handle (not one object, no id,
// a "capyctl" member of its own).
func (q *request) spliceJSON(data []byte) ([]byte, bool) {
	var buf [16]member
	ms, ok := topLevel(data, buf[:0])
	if !ok {
		return nil, false
	}
	var id, model, rid, usage, timings = -1, -1, -1, -1, -1
	for i, m := range ms {
		switch string(m.key) {
		case "id":
			id = i
		case "model":
			model = i
		case "rid":
			rid = i
		case "usage":
			usage = i
		case "timings":
			timings = i
		case "capyctl":
			return nil, false
		}
	}
	if id < 0 || (model < 0 && q.api == structs.APIDecisions) {
		return nil, false
	}
	if usage >= 0 {
		q.usage.parse(data[ms[usage].val:ms[usage].end])
	}
	if timings >= 0 {
		q.timings.parse(data[ms[timings].val:ms[timings].end])
	}
	q.contentN = q.usage.completion
	out := make([]byte, 0, len(data)+len(q.id)+len(q.model)+320)
	out = append(out, '{')
	first := true
	for i, m := range ms {
		if i == rid {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		switch i {
		case id:
			out = append(out, `"id":`...)
			out = appendJSONString(out, q.id)
		case model:
			out = append(out, `"model":`...)
			out = appendJSONString(out, q.model)
		default:
			out = append(out, data[m.start:m.end]...)
		}
	}
	out = append(out, `,"capyctl":{"metrics":`...)
	out = q.appendMetrics(out)
	out = append(out, "}}\n"...)
	return out, true
}

// rebuildJSON is spliceJSON for an answer it could not handle, decoded.
func (q *request) rebuildJSON(m map[string]json.RawMessage) []byte {
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
	return append(out, '\n')
}

// appendJSONString appends s as a JSON string, without allocating:
// quotes, backslashes and control characters escaped, invalid UTF-8
// replaced by U+FFFD and U+2028/U+2029 escaped, as encoding/json does (it
// also escapes <, > and &, which JSON does not need).
func appendJSONString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexd[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
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
