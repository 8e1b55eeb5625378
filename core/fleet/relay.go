// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// A relayed stream reads the host's answer into a small pooled buffer
// while it waits for its next chunk (an open stream holds it: an SSE chunk
// is a few hundred bytes), and, after a read that filled it, into a large
// one: a fast engine's chunks arrive together, and leave in one write
// instead of one per small buffer. Each read's bytes are written before
// the next read, so that no chunk waits for the next.
const (
	relayBufSize = 1 << 10
	burstBufSize = 32 << 10
)

var (
	relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}
	burstBufs = sync.Pool{New: func() any { b := make([]byte, burstBufSize); return &b }}
)

// relayBuf hands out a relayed stream's read buffers.
type relayBuf struct {
	bp    *[]byte
	burst bool // the last read filled its buffer: the next one reads into a large one
}

// get takes the buffer for the next read.
func (r *relayBuf) get() []byte {
	if r.burst {
		r.bp = burstBufs.Get().(*[]byte)
	} else {
		r.bp = relayBufs.Get().(*[]byte)
	}
	return *r.bp
}

// put gives the buffer back after a read of n bytes.
func (r *relayBuf) put(n int) {
	if r.burst {
		burstBufs.Put(r.bp)
	} else {
		relayBufs.Put(r.bp)
	}
	r.burst = n == len(*r.bp)
	r.bp = nil
}

// InferenceHandler is the server's inference API: every request is
// relayed to a host that runs the model, behind the API keys. Each body is
// at most maxBody bytes and all bodies held at once at most maxInFlight
// (limits.max_body_bytes, limits.max_body_bytes_in_flight; 0: the
// router's defaults).
func (s *Server) InferenceHandler(keys *apikeys.Keeper, auth api.AuthOptions, maxBody, maxInFlight int64) http.Handler {
	bodies := router.NewBodyLimiter(maxBody, maxInFlight)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/", func(w http.ResponseWriter, r *http.Request) { s.relayInference(w, r, bodies) })
	s.handleResponses(mux, bodies) // the Responses API's stored responses (responses.go)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		relayError(w, r, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	return api.InferenceAuth(mux, keys, auth)
}

// relayInference relays one inference request to the least busy reachable
// host of the model's placement.
func (s *Server) relayInference(w http.ResponseWriter, r *http.Request, bodies *router.BodyLimiter) {
	body, release, ok := readRelayBody(w, r, bodies)
	defer release()
	if ok {
		s.relayBody(w, r, body, nil)
	}
}

// readRelayBody reads an inference request's body within the server's
// bounds (limits.max_body_bytes, and all bodies in flight together
// limits.max_body_bytes_in_flight); false when it answered why not. The
// body counts against the bound until release, which the caller calls
// once the host has it (when its handler returns).
func readRelayBody(w http.ResponseWriter, r *http.Request, bodies *router.BodyLimiter) (body []byte, release func(), ok bool) {
	// The host's router names the request (its request ledger holds it
	// under that ID) and its answer carries it; an answer the server
	// makes itself gets an ID of its own. The client's X-Request-Id
	// travels as it is.
	w.Header().Set(router.HeaderRequestID, router.NewRequestID())
	body, release, err := bodies.Read(r)
	if err != nil {
		router.CloseUnread(w) // refused before it was read whole
		relayError(w, r, err)
		return nil, release, false
	}
	return body, release, true
}

// relayError answers an error the server makes itself: in Anthropic's
// shape on the Messages routes, CapyCTL's elsewhere.
func relayError(w http.ResponseWriter, r *http.Request, err error) {
	if p := r.URL.Path; p == router.MessagesPath || strings.HasPrefix(p, router.MessagesPath+"/") {
		router.WriteAnthropicError(w, err)
		return
	}
	router.WriteError(w, err)
}

// relayBody relays one inference request's body to a host of the model;
// tap, when set, sees the host's answer before the client does.
func (s *Server) relayBody(w http.ResponseWriter, r *http.Request, body []byte, tap func(*http.Response)) {
	// The request's key settles once the answer ended (a stream's too):
	// its limits and usage count what the host's answer reported.
	meter := meterFor(r)
	var u undo
	defer u.run()
	u.push(meter.end)
	refuse := func(err error) {
		if r.Context().Err() == nil {
			meter.refused(err)
			relayError(w, r, err)
		}
	}
	p, hosts, hdr, err := s.relayTarget(r, body, meter)
	if err != nil {
		refuse(err)
		return
	}
	rl, err := s.relaySend(r, p, hosts, hdr, body, &u)
	if err != nil {
		refuse(err)
		return
	}
	if tap != nil {
		tap(rl.resp)
	}
	meter.watch(rl.resp)
	// A stream may outlive the handler (taken over, relaytaken.go): the
	// client's context cancels it only while it is on net/http (unless it
	// did already), the watcher does after.
	if strings.HasPrefix(rl.resp.Header.Get("Content-Type"), "text/event-stream") && rl.unhook() {
		s.streams.add(1)
		u.push(func() { s.streams.add(-1) })
		relayStream(w, r, rl, &u)
		return
	}
	copyAnswer(w, r, rl)
}

// relayStream relays a host's streamed answer whose relayed stream no
// longer ends with the client's context: on net/http, where the client's
// context cancels it, then, once it has run for takeOverAfter, taken over
// (relaytaken.go), where the watcher does; what the stream took (u) ends
// with it.
func relayStream(w http.ResponseWriter, r *http.Request, rl hostReply, u *undo) {
	rehook := context.AfterFunc(r.Context(), rl.cancel)
	u.push(func() { rehook() })
	copyStream(w, r, rl, laterTakeOver(w, r, rl, u, rehook))
}

// hostReply is a host's answer to a relayed request: cancel ends the
// relayed stream, unhook stops the client's context from cancelling it
// (false when it did already).
type hostReply struct {
	resp   *http.Response
	cancel context.CancelFunc
	unhook func() bool
	// ctx is the relayed stream's (ended by cancel); host answers it;
	// stopping closes when the server stops (its drain over, it cuts what
	// is left).
	ctx      context.Context
	host     string
	stopping <-chan struct{}
}

// relayTarget finds the placement that serves the request's model, the
// hosts that may answer it (a group's head; once every member is up), and
// the headers the hosts get: the host names the request after the
// client's key (its request log, its fair share of the model's places).
func (s *Server) relayTarget(r *http.Request, body []byte, meter *relayMeter) (*Placement, []string, http.Header, error) {
	// The model as the host's router reads it (by its exact name): the
	// server places the request where the host serves the same model.
	model, err := router.RequestModel(body)
	if err != nil {
		return nil, nil, nil, structs.Errf(structs.CodeInvalidRequest, "%v", err)
	}
	if model == "" {
		return nil, nil, nil, structs.Errf(structs.CodeInvalidRequest, "the request names no model")
	}
	caller := router.CallerOf(r.Context())
	p, ok := s.State.RouteOwner(model)
	if ok && caller.Allows(model) {
		p, ok = s.awaitMade(r.Context(), model, p) // a deployment its hosts are making
	}
	// IMPORTANT: a model the key may not use is answered exactly as one no
	// deployment serves.
	if !ok || !caller.Allows(model) {
		return nil, nil, nil, structs.Errf(structs.CodeUnknownModel, "no deployment serves model %q (GET /v1/models lists them)", model)
	}
	meter.model = model
	hdr := r.Header.Clone()
	hdr.Set(router.HeaderKeyName, caller.Key)
	hdr.Set(router.HeaderKeyWeight, strconv.Itoa(max(caller.Weight, 1)))
	if s.placing(p) {
		e := structs.Errf(structs.CodeUnavailable, "deployment %s is being placed on its hosts: retry", p.Deployment).WithDetail("deployment", p.Deployment)
		e.RetryAfter = 1
		return nil, nil, nil, e
	}
	if p.Group == nil {
		return p, p.HostNames(), hdr, nil
	}
	// A group answers on its head only, once every member is up.
	if err := s.ensureGroupUp(r.Context(), p); err != nil {
		return nil, nil, nil, err
	}
	return p, p.Group.Hosts[:1], hdr, nil
}

// relaySend sends the request to the least busy reachable host of hosts
// and returns its answer; what the send took (the host's count, the
// relayed stream's context, the hook that cancels it with the client's,
// the answer's body) is pushed on u. A request that never left the server
// (the host's relay closed between the pick and the send) goes to another
// replica; one the host may have received is not sent twice. A group's
// head that says its group is not up (this server's view was older than
// a park or stop) has its group started and the request sent once more.
func (s *Server) relaySend(r *http.Request, p *Placement, hosts []string, hdr http.Header, body []byte, u *undo) (hostReply, error) {
	groupTry := 0
	for attempt := 0; ; attempt++ {
		host, done := s.pick(hosts)
		if host == "" {
			e := structs.Errf(structs.CodeHostUnreachable, "every host of deployment %s is out of reach of the server (%s); its instances are uncertain", p.Deployment, strings.Join(p.HostNames(), ", ")).
				WithDetail("deployment", p.Deployment).WithDetail("hosts", p.HostNames())
			e.RetryAfter = int(2*s.o.Heartbeat.Seconds()) + 1
			return hostReply{}, e
		}
		var try undo
		try.push(done)
		// The relayed stream's context is the client's until the answer's
		// head arrives; a streamed answer then outlives the handler
		// (takeOver).
		rctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		try.push(cancel)
		unhook := context.AfterFunc(r.Context(), cancel)
		try.push(func() { unhook() })
		resp, err := s.roundTrip(rctx, host, r.Method, r.URL.RequestURI(), hdr, "", body)
		if err == nil {
			try.push(func() { resp.Body.Close() })
		}
		switch {
		case err == nil && p.Group != nil && groupTry == 0 && resp.StatusCode == http.StatusServiceUnavailable &&
			s.memberOf(r.Context(), host, 0, p.Deployment).state != string(structs.StateReady):
			groupTry++
			try.run()
			s.groups.setDown(p.Deployment, true)
			if err := s.ensureGroupUp(r.Context(), p); err != nil {
				return hostReply{}, err
			}
			attempt = -1
			continue
		case err == nil:
			u.fns = append(u.fns, try.handOver().fns...)
			rl := hostReply{resp: resp, cancel: cancel, unhook: unhook, ctx: rctx, host: host}
			if s.ctx != nil {
				rl.stopping = s.ctx.Done()
			}
			return rl, nil
		}
		try.run()
		if r.Context().Err() != nil {
			return hostReply{}, r.Context().Err() // the client hung up: the reset stream cancelled the host's work
		}
		if attempt == 0 && notSent(err) && len(hosts) > 1 {
			tried := host
			hosts = slices.DeleteFunc(slices.Clone(hosts), func(h string) bool { return h == tried })
			continue
		}
		e := structs.Errf(structs.CodeHostUnreachable, "the relay to host %s failed: %v", host, err).WithDetail("host", host)
		e.RetryAfter = 1
		return hostReply{}, e
	}
}

// DrainStreams waits until the streams the server took over from net/http
// have ended, or ctx ends (then Close cuts them): a stopping server lets
// them finish for the drain timeout, as a standalone role does.
func (s *Server) DrainStreams(ctx context.Context) {
	s.streams.wait(ctx)
}

// notSent reports whether a relay error means the request never left the
// server: the host's connection was closed or unusable before the request
// was written (x/net/http2's errors say so in their text only).
func notSent(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "client conn is closed") || strings.Contains(msg, "client conn not usable") ||
		strings.Contains(msg, "is not connected")
}

// pick returns the reachable host with the fewest requests in flight (ties
// taken in turn) and the function that ends this request's count; "" when
// none is reachable.
func (s *Server) pick(hosts []string) (string, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *liveHost
	s.turn++
	for i := range hosts {
		h := s.hosts[hosts[(i+int(s.turn))%len(hosts)]]
		if h == nil || h.linkCancel == nil || !relayUp(h.relay) {
			continue
		}
		if best == nil || h.inFlight < best.inFlight {
			best = h
		}
	}
	if best == nil {
		return "", func() {}
	}
	best.inFlight++
	return best.name, func() {
		s.mu.Lock()
		best.inFlight--
		s.mu.Unlock()
	}
}

// roundTrip sends one request to a host over its relay. The request's
// context is the client's: a hang-up resets the stream.
func (s *Server) roundTrip(ctx context.Context, host, method, uri string, hdr http.Header, id string, body []byte) (*http.Response, error) {
	cc, ok := s.relayOf(host)
	if !ok {
		return nil, structs.Errf(structs.CodeHostUnreachable, "host %s is not connected", host)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	out, err := http.NewRequestWithContext(ctx, method, "https://"+host+uri, rd)
	if err != nil {
		return nil, err
	}
	copyHeaders(out.Header, hdr, relayRequestHeaders)
	if id != "" {
		out.Header.Set(router.HeaderRequestID, id)
	}
	if body != nil && out.Header.Get("Content-Type") == "" {
		out.Header.Set("Content-Type", "application/json")
	}
	out.ContentLength = int64(len(body))
	return cc.RoundTrip(out)
}

// copyAnswer writes a host's answer to the client as it arrives, flushing
// after every read so streamed chunks are not held; a stream is written
// in whole events, and one that breaks off ends with a coded event
// (relaycut.go).
func copyAnswer(w http.ResponseWriter, r *http.Request, rl hostReply) {
	copyStream(w, r, rl, nil)
}

// copyStream is copyAnswer that, after each flush of a stream, asks
// takeOver (when not nil) whether the stream was taken over from net/http
// and goes on elsewhere: then it returns at once.
func copyStream(w http.ResponseWriter, r *http.Request, rl hostReply, takeOver func(*sseRelay) bool) {
	resp := rl.resp
	copyHeaders(w.Header(), resp.Header, relayAnswerHeaders)
	w.WriteHeader(resp.StatusCode)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// A whole answer: net/http's buffers, one flush at the end. An
		// answer the host cut short is cut here too, never completed.
		if _, err := io.Copy(w, resp.Body); err != nil {
			panic(http.ErrAbortHandler)
		}
		return
	}
	rc := http.NewResponseController(w)
	var rb relayBuf
	var ev sseRelay
	for {
		buf := rb.get()
		n, err := resp.Body.Read(buf)
		if out := ev.whole(buf[:n]); len(out) > 0 {
			if _, werr := w.Write(out); werr != nil {
				rb.put(n)
				return
			}
			_ = rc.Flush()
		}
		rb.put(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				_, _ = w.Write(ev.rest())
				return
			}
			if end := brokeOff(rl, r.URL.Path, err); end != nil {
				_, _ = w.Write(end)
				_ = rc.Flush()
				return
			}
			panic(http.ErrAbortHandler) // cut short: no final chunk that would make it look whole
		}
		if takeOver != nil && takeOver(&ev) {
			return
		}
	}
}

// maxModelsAnswer bounds a host's answer to GET /v1/models.
const maxModelsAnswer = 1 << 20

// models answers GET /v1/models with every reachable host's models, each
// once.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	// The fields a host's router writes (router.Models), nothing more.
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		CapyCTL *struct {
			API        string   `json:"api"`
			Deployment string   `json:"deployment"`
			State      string   `json:"state"`
			Endpoints  []string `json:"endpoints"`
		} `json:"capyctl,omitempty"`
	}
	seen := map[string]model{}
	ctx, cancel := context.WithTimeout(r.Context(), fanOutTimeout)
	defer cancel()
	for _, name := range s.reachable() {
		resp, err := s.roundTrip(ctx, name, http.MethodGet, "/v1/models", nil, "", nil)
		if err != nil {
			continue
		}
		var list struct {
			Data []model `json:"data"`
		}
		// A host's answer is bounded, and only the models the cluster
		// routes to it are taken from it (a host is trusted with what is
		// placed on it: linkbounds.go).
		if resp.StatusCode == http.StatusOK {
			_ = json.NewDecoder(io.LimitReader(resp.Body, maxModelsAnswer)).Decode(&list)
		}
		resp.Body.Close()
		for _, m := range list.Data {
			id := m.ID
			if p, routed := s.State.RouteOwner(id); !routed || !slices.Contains(p.HostNames(), name) {
				continue
			}
			if _, dup := seen[id]; id != "" && !dup {
				seen[id] = m
			}
		}
	}
	caller := router.CallerOf(r.Context())
	ids := make([]string, 0, len(seen))
	for id := range seen {
		if caller.Allows(id) { // a key sees only the models it may use
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	data := make([]model, 0, len(ids))
	for _, id := range ids {
		data = append(data, seen[id])
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// reachable lists the hosts whose link and relay are up, by name.
func (s *Server) reachable() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, h := range s.hosts {
		if h.linkCancel != nil && relayUp(h.relay) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
