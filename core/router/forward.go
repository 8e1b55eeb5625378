// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"
	"crypto/sha256"
	hexenc "encoding/hex"
	"encoding/json"
	"errors"
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
	switch q.api {
	case structs.APIDecisions:
		path = ep.DecisionsPath
		if path == "" {
			path = decisions.Path
		}
	case structs.APICompletions:
		path = ep.CompletionsPath
		if path == "" {
			path = "/v1/completions"
		}
	case structs.APIEmbeddings:
		// vLLM, SGLang and llama-server all serve it there.
		path = embeddingsPath
	case structs.APIRerank:
		// vLLM and llama-server (--reranking) both serve it there.
		path = rerankPath
	}
	native := false
	if q.dl != nil {
		// dialect: the engine's own route for the client's API, or chat.
		var err error
		if path, native, err = q.dl.route(ep); err != nil {
			q.place.Done()
			q.place = nil
			q.fail(err)
			return nil
		}
	}
	t, err := q.rt.targets.engineURL(ep.BaseURL, path)
	if err != nil {
		q.place.Done()
		q.place = nil
		q.fail(structs.Wrap(structs.CodeInternal, err, "engine endpoint of %s", q.target.Instance))
		return nil
	}
	if q.hasSalt && !ep.CacheSalt {
		q.place.Done()
		q.place = nil
		q.fail(structs.Errf(structs.CodeCacheSaltUnsupported, "model %q runs where cache_salt is not honoured (llama.cpp, TensorFold, a custom engine, or vLLM or SGLang with LMCache, whose keys ignore it): remove it, or deploy with lmcache = \"off\"", q.model))
		return nil
	}
	var body []byte
	if q.dl != nil {
		body, err = q.dl.body(q, ep, native)
	} else {
		body, err = q.engineBody()
	}
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
				"the role holds %s of request bodies, its bound (limits.max_body_bytes_in_flight); retry shortly", structs.FormatBytes(q.rt.cfg.MaxBodyBytesInFlight)))
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
	case resp.StatusCode >= 400 && q.dl != nil && q.dialectStatus(call):
	case resp.StatusCode >= 400:
		q.engineStatusError(call)
	case (q.api == structs.APIChat || q.api == structs.APICompletions) && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
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
	if q.target.Endpoint.AbortByID && !pooling(q.api) && q.rt.req != nil {
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
	// An embeddings or rerank request goes without the request ID in its
	// body: it is not a generation an engine aborts by ID (a hang-up
	// closes its connection), and SGLang's embeddings request has no rid.
	needRid := ep.RequestIDField != "" && !pooling(q.api)
	needStream := (q.api == structs.APIChat || q.api == structs.APICompletions) && ((!q.stream && !ep.ForwardNonStreamed) || (q.stream && !q.usageOpt))
	needSalt := q.hasSalt
	if !needModel && !needRid && !needStream && !needSalt {
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
	out := make([]byte, 0, len(q.body)+len(q.id)+len(ep.ServedName)+64+len(`,"cache_salt":""`)+sha256.Size*2)
	out = append(out, '{')
	var opts []byte // the client's stream_options, the last one
	for _, m := range ms {
		k := m.key
		switch {
		case needModel && string(k) == "model",
			needRid && string(k) == ep.RequestIDField,
			needStream && string(k) == "stream",
			needSalt && string(k) == "cache_salt":
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
	if needSalt {
		out = appendMember(out, "cache_salt")
		out = appendJSONString(out, q.saltDigest())
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
	if q.hasSalt {
		m["cache_salt"], _ = json.Marshal(q.saltDigest())
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

// maxCacheSalt bounds a request's cache_salt.
const maxCacheSalt = 1024

// takeSalt keeps a request's cache_salt (nil: none); false when it
// answered a salt that is empty or longer than maxCacheSalt bytes.
func (q *request) takeSalt(salt *string) bool {
	if salt == nil {
		return true
	}
	if *salt == "" || len(*salt) > maxCacheSalt {
		q.fail(structs.Errf(structs.CodeInvalidRequest, "cache_salt must be a non-empty string of at most %d bytes", maxCacheSalt))
		return false
	}
	q.salt, q.hasSalt = *salt, true
	return true
}

// saltDigest is the cache_salt the engine gets: hex(sha256(deployment
// "\x00" revision "\x00" salt)). IMPORTANT: the deployment and the
// revision the instance serves are in it, so two deployments (or two
// revisions of one, another model perhaps) never share a cache entry, in
// the engine's prefix cache or in LMCache, whatever salts clients send.
func (q *request) saltDigest() string {
	return CacheSaltDigest(q.route.Deployment, q.target.Revision, q.salt)
}

// CacheSaltDigest is the cache_salt an engine gets for a client's salt on
// a deployment's revision.
func CacheSaltDigest(deployment string, revision uint64, salt string) string {
	h := sha256.New()
	h.Write([]byte(deployment))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatUint(revision, 10)))
	h.Write([]byte{0})
	h.Write([]byte(salt))
	return hexenc.EncodeToString(h.Sum(nil))
}
