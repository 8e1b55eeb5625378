// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/takeover"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// Outcomes of a request, as the ledger and the metrics name them.
const (
	OutcomeCompleted      = "completed"
	OutcomeCancelled      = "cancelled"
	OutcomeRefused        = "refused"
	OutcomeEngineError    = "engine_error"
	OutcomeEngineRejected = "engine_rejected"
	OutcomeDeadline       = "deadline"
	OutcomeStreamIdle     = "stream_idle"
	OutcomeClientIdle     = "client_read_idle"
	OutcomeChunkTooLarge  = "chunk_too_large"
	OutcomeShutdown       = "shutting_down"
)

// Causes of a cut, carried by the engine request's context.
var (
	errDeadline   = errors.New("no output within the request deadline")
	errStreamIdle = errors.New("no output within the stream idle bound")
	errChunk      = errors.New("an engine chunk over the chunk bound")
	errClientIdle = errors.New("the client read nothing within the client read bound")
	errClientGone = errors.New("the client went away")
)

// bounds are a deployment's per-request bounds.
type bounds struct {
	deadline   time.Duration
	streamIdle time.Duration
	clientIdle time.Duration
	maxChunk   int
	places     int
	maxWaiting int
}

// depState is the router's state of one deployment.
type depState struct {
	name  string
	adm   *admission.Deployment
	route atomic.Pointer[routes.Route]
	b     atomic.Pointer[bounds]
	m     *depMetrics
}

// depFor returns the state of a route's deployment, synced with it.
func (rt *Router) depFor(route *routes.Route) *depState {
	v, ok := rt.deps.Load(route.Deployment)
	if !ok {
		v, _ = rt.deps.LoadOrStore(route.Deployment, &depState{
			name: route.Deployment,
			adm:  rt.adm.Deployment(route.Deployment),
			m:    rt.stats.deployment(route.Deployment),
		})
	}
	ds := v.(*depState)
	if ds.route.Load() != route {
		rt.sync(ds, route)
	}
	return ds
}

// sync applies a route table's view of a deployment: bounds, places, ready
// instances.
func (rt *Router) sync(ds *depState, route *routes.Route) {
	b := &bounds{
		deadline:   rt.cfg.DefaultDeadline,
		streamIdle: DefaultStreamIdle,
		clientIdle: DefaultClientReadIdle,
		maxChunk:   DefaultMaxChunkBytes,
		places:     admission.DefaultPlaces,
		maxWaiting: admission.DefaultMaxWaiting,
	}
	if s := route.Spec; s != nil {
		fromFile := func(path string) bool { return s.Provenance == nil || s.Provenance[path] != "default" }
		if s.RequestDeadline > 0 && fromFile("request_deadline") {
			b.deadline = s.RequestDeadline.D()
		}
		if s.Limits.StreamIdle > 0 {
			b.streamIdle = s.Limits.StreamIdle.D()
		}
		if s.Limits.ClientReadIdle > 0 {
			b.clientIdle = s.Limits.ClientReadIdle.D()
		}
		if s.Limits.MaxChunkBytes > 0 {
			b.maxChunk = int(s.Limits.MaxChunkBytes)
		}
		if s.EngineConfig.MaxConcurrentRequests > 0 {
			b.places = s.EngineConfig.MaxConcurrentRequests
		}
		switch {
		case s.Limits.MaxWaiting > 0:
			b.maxWaiting = s.Limits.MaxWaiting
		case s.Provenance != nil && s.Provenance["limits.max_waiting"] == "file":
			b.maxWaiting = 0 // the operator asked that nobody wait
		}
	}
	ds.b.Store(b)
	ds.adm.SetLimits(b.places, b.maxWaiting)
	targets := make([]admission.Target, 0, len(route.Ready))
	for _, t := range route.Ready {
		targets = append(targets, admission.Target{Instance: t.Instance, Generation: t.Generation})
	}
	ds.adm.Sync(route, targets)
	ds.route.Store(route)
}

// request is one request on its way through the router.
type request struct {
	rt       *Router
	w        http.ResponseWriter
	r        *http.Request
	rc       *http.ResponseController
	api      string
	id       string
	clientID string
	body     []byte // released once the engine has it
	bodyN    int
	bodyHeld int64 // bytes of the role's body bound the body holds (body.go, serve)
	model    string
	stream   bool
	usageOpt bool // the client asked for the usage chunk
	// salt is the client's cache_salt (chat and completions), forwarded
	// as a digest of the deployment, its revision and the salt; hasSalt
	// says there is one.
	salt    string
	hasSalt bool

	route  *routes.Route
	ds     *depState
	b      *bounds
	place  *admission.Place
	target *routes.Target

	start        time.Time
	activation   time.Duration
	activated    bool
	granted      time.Time
	forwardAt    time.Time
	headAt       time.Time
	firstContent time.Time
	lastContent  time.Time
	contentSeen  bool // output arrived since lastContent was stamped (stampContent)
	endAt        time.Time

	headersSent bool
	cw          int         // where answer bytes go: cwHTTP, cwPending, cwHijacked (hijack.go)
	sseOut      bool        // the answer is an event stream: its bytes gather in out until a flush, on net/http too
	hjOK        bool        // the client connection may be taken over (hijack.go)
	headViaHTTP bool        // net/http wrote the head (progress) before any take-over
	handedOff   bool        // the stream goes on on its own goroutine (relayOn)
	out         outBuf      // bytes of a pending head or a taken-over connection
	cc          *clientConn // the connection taken over from net/http
	st          *sseState   // a handed-off stream's relay state
	writeErr    error
	sawFinish   bool
	progressed  bool
	status      int
	code        string
	outcome     string
	bytesOut    int64
	contentN    int64

	usage   usageFigures
	timings engineTimings

	cutter   cutter      // ends the engine work on a hang-up or a bound
	stopGone func() bool // stops the hang-up callback

	dl dialect // the API a dialect request came in (dialect.go); nil for the others

	caller Caller // who sent it (identity.go); its meter settles in finish
	// allowed says the model resolved to a route the caller may use: the
	// key's usage counts the request under the model's name.
	allowed bool
}

// chatHead is the part of a chat body the router reads (parseChatHead
// fills it, by the members' exact names).
type chatHead struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Messages      arrayPresence   `json:"messages"`
	N             *int            `json:"n"`
	Functions     json.RawMessage `json:"functions"`
	// CacheSalt is the client's cache_salt, nil when absent or null.
	CacheSalt *string `json:"cache_salt"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// arrayPresence records whether a field is a non-empty JSON array without
// copying it.
type arrayPresence int

// UnmarshalJSON implements json.Unmarshaler.
func (a *arrayPresence) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) >= 2 && b[0] == '[' && !isEmptyArray(b):
		*a = 2
	case len(b) >= 2 && b[0] == '[':
		*a = 1
	default:
		*a = -1
	}
	return nil
}

func isEmptyArray(b []byte) bool {
	for _, c := range b[1:] {
		switch c {
		case ' ', '\t', '\n', '\r':
		case ']':
			return true
		default:
			return false
		}
	}
	return false
}

func (rt *Router) serve(w http.ResponseWriter, r *http.Request, api string) {
	rt.serveWith(w, r, api, nil)
}

// serveDialect serves a dialect request (dialect.go) on the chat path.
func (rt *Router) serveDialect(w http.ResponseWriter, r *http.Request, dl dialect) {
	rt.serveWith(w, r, structs.APIChat, dl)
}

func (rt *Router) serveWith(w http.ResponseWriter, r *http.Request, api string, dl dialect) {
	q := &request{rt: rt, w: w, r: r, api: api, start: time.Now(), id: NewRequestID(), dl: dl, caller: CallerOf(r.Context())}
	if q.caller.Meter != nil {
		q.caller.Meter.Take() // settled in finish, after a stream too
	}
	// dialect: a re-encoded stream stays on its net/http handler.
	q.hjOK = dl == nil && !rt.cfg.KeepStreamsOnNetHTTP && takeover.Possible(w, r)
	h := w.Header()
	h.Set(HeaderRequestID, q.id)
	defer q.finishHere()
	if cid := r.Header.Get(HeaderClientRequestID); cid != "" {
		if !ValidClientRequestID(cid) {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "X-Request-Id must be 1 to 128 printable ASCII characters without spaces"))
			return
		}
		q.clientID = cid
		h.Set(HeaderClientRequestID, cid)
	}
	if !q.readBody() {
		return
	}
	// The body's bytes go back to the role's bound once the engine has it,
	// or when the request ends before. IMPORTANT: through a local, since
	// nothing of q is touched here after a stream is handed off.
	held := q.bodyHeld
	defer func() { rt.bodies.give(held) }()
	if !q.resolve() || !q.admit() {
		return
	}
	call := q.forward()
	rt.bodies.give(held)
	held = 0
	if call != nil {
		q.relay(call)
		if q.handedOff {
			// IMPORTANT: started here, at the bottom of the handler's
			// stack, and nothing of q is touched by this goroutine after.
			go q.relayOn()
		}
	}
}

// finishHere finishes the request on the handler's goroutine, unless its
// stream was handed off to relayOn, which finishes it.
func (q *request) finishHere() {
	if !q.handedOff {
		q.finish()
	}
}

// resolve finds the model's route and validates the body. api_mismatch is
// decided from the model name alone, before the rest is validated, and
// wakes nothing.
func (q *request) resolve() bool {
	var head chatHead
	var headErr error
	generates := q.api == structs.APIChat || q.api == structs.APICompletions
	if q.dl != nil {
		// dialect: it reads the client's body (model, stream) itself.
		if err := q.dl.parse(q); err != nil {
			q.fail(err)
			return false
		}
		generates = false
	} else if generates {
		headErr = parseChatHead(q.body, &head)
		q.model = head.Model
	}
	if q.dl == nil && (!generates || headErr != nil) {
		m, err := RequestModel(q.body)
		if err != nil {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "%v", err))
			return false
		}
		q.model = m
	}
	if q.model == "" {
		q.fail(structs.Errf(structs.CodeInvalidRequest, "the request names no model"))
		return false
	}
	route := q.rt.cfg.Routes.Load().Lookup(q.model)
	// IMPORTANT: a model the caller's key may not use is answered exactly
	// as one that does not exist, on the same path: a key cannot learn
	// what else is deployed.
	if route == nil || !q.caller.Allows(q.model) {
		q.fail(structs.Errf(structs.CodeUnknownModel, "no model %q: GET /v1/models lists the models", q.model))
		return false
	}
	q.allowed = true
	q.route = route
	api := route.API
	if api == "" {
		api = structs.APIChat
	}
	if !serves(api, q.api) {
		path := Endpoints(api)[0]
		q.fail(structs.Errf(structs.CodeAPIMismatch, "model %q serves the %s API: send its requests to %s", q.model, api, path).
			WithDetail("endpoint", path))
		return false
	}
	switch {
	case q.dl != nil:
	case q.api == structs.APIChat:
		if headErr != nil {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "the request body is not a valid chat request: %v", headErr))
			return false
		}
		if head.Messages != 2 {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "messages must be a non-empty array"))
			return false
		}
		if head.N != nil && *head.N != 1 {
			q.fail(structs.Errf(structs.CodeUnsupportedParameter, "n must be 1: CapyCTL answers one choice per request"))
			return false
		}
		if len(head.Functions) > 0 && string(head.Functions) != "null" {
			q.fail(structs.Errf(structs.CodeUnsupportedParameter, "functions is deprecated: send tools"))
			return false
		}
		q.stream = head.Stream
		q.usageOpt = head.StreamOptions != nil && head.StreamOptions.IncludeUsage
		if !q.takeSalt(head.CacheSalt) {
			return false
		}
	case q.api == structs.APICompletions:
		if headErr != nil {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "the request body is not a valid completions request: %v", headErr))
			return false
		}
		if head.N != nil && *head.N != 1 {
			q.fail(structs.Errf(structs.CodeUnsupportedParameter, "n must be 1: CapyCTL answers one choice per request"))
			return false
		}
		q.stream = head.Stream
		q.usageOpt = head.StreamOptions != nil && head.StreamOptions.IncludeUsage
		if !q.takeSalt(head.CacheSalt) {
			return false
		}
	case q.api == structs.APIEmbeddings:
		if !hasMember(q.body, "input") {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "an embeddings request needs an input: a string or a list of strings"))
			return false
		}
	case q.api == structs.APIRerank:
		if !hasMember(q.body, "query") || !hasMember(q.body, "documents") {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "a rerank request needs a query and documents"))
			return false
		}
	case q.api == structs.APIDecisions:
		var dr decisions.Request
		if err := json.Unmarshal(q.body, &dr); err != nil {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "the request body is not a valid decision request: %v", err))
			return false
		}
		if err := dr.Validate(); err != nil {
			q.fail(structs.Errf(structs.CodeInvalidRequest, "%v", err))
			return false
		}
	}
	q.ds = q.rt.depFor(route)
	q.b = q.ds.b.Load()
	return true
}

// embeddingsPath is the embeddings endpoint, the router's and the
// engines'.
const embeddingsPath = "/v1/embeddings"

// rerankPath is the rerank endpoint, the router's and the engines' (vLLM
// and llama-server serve it there, Jina's and Cohere's shape).
const rerankPath = "/v1/rerank"

// pooling reports whether api is one a pooling model serves (embeddings,
// rerank): one whole JSON answer, no first token, no request ID in the
// engine's body, a hang-up closes the engine connection, and no id is
// added to an answer without one.
func pooling(api string) bool {
	return api == structs.APIEmbeddings || api == structs.APIRerank
}

// serves reports whether a deployment serving api answers requests of kind
// (the endpoint they came to): a chat deployment serves text completions
// too.
func serves(api, kind string) bool {
	return api == kind || (api == structs.APIChat && kind == structs.APICompletions)
}

// Endpoints are the inference endpoints of a deployment serving api, as
// /v1/models lists them (capyctl.endpoints); the first is its main one.
func Endpoints(api string) []string {
	switch api {
	case structs.APIDecisions:
		return []string{decisions.Path}
	case structs.APIEmbeddings:
		return []string{embeddingsPath}
	case structs.APIRerank:
		return []string{rerankPath}
	default:
		return []string{"/v1/chat/completions", "/v1/completions", ResponsesPath, MessagesPath, CountTokensPath}
	}
}

// deadlineLeft is what remains of the request's deadline.
func (q *request) deadlineLeft() time.Duration {
	return q.b.deadline - time.Since(q.start)
}

// admit takes a place, waiting in the deployment's line (and for an
// activation) when needed.
func (q *request) admit() bool {
	if q.route.Desired == structs.DesiredStopped {
		// The lifecycle words the refusal (stopped or explicit activation).
		if err := q.rt.lc.Activate(q.r.Context(), q.route.Deployment); err != nil {
			q.fail(err)
			return false
		}
		q.resync()
	}
	for try := 0; try < 3; try++ {
		place, waiter, err := q.ds.adm.EnterFor(int64(len(q.body)), admission.Fair{Key: q.caller.Key, Weight: q.caller.Weight})
		if err != nil {
			if !q.ds.adm.Ready() && q.b.maxWaiting == 0 {
				// Nobody may wait: refuse, but start the model for the retry.
				go func(dep string) {
					ctx, cancel := context.WithTimeout(q.rt.ctx, 30*time.Minute)
					defer cancel()
					_ = q.rt.lc.Activate(ctx, dep)
				}(q.route.Deployment)
			}
			q.fail(err)
			return false
		}
		if waiter != nil {
			if place = q.wait(waiter); place == nil {
				return false
			}
		}
		q.granted = time.Now()
		if q.r.Context().Err() != nil {
			place.Done()
			q.gone()
			return false
		}
		q.place = place
		if q.target = q.targetFor(place); q.target != nil {
			// Least recently used victims and idle timers read it.
			q.target.Touch(time.Now())
			return true
		}
		// The instance left the ready set between the grant and now.
		place.Done()
		q.place = nil
		q.resync()
	}
	q.fail(structs.Errf(structs.CodeUnavailable, "model %q has no ready instance", q.model))
	return false
}

// resync reads the current route table.
func (q *request) resync() bool {
	route := q.rt.cfg.Routes.Load().Lookup(q.model)
	if route == nil {
		return false
	}
	q.route = route
	q.ds = q.rt.depFor(route)
	q.b = q.ds.b.Load()
	return true
}

// targetFor returns the ready target a place is on.
func (q *request) targetFor(p *admission.Place) *routes.Target {
	find := func(route *routes.Route) *routes.Target {
		for _, t := range route.Ready {
			if t.Instance == p.Instance && t.Generation == p.Generation {
				return t
			}
		}
		return nil
	}
	if route := q.ds.route.Load(); route != nil {
		if t := find(route); t != nil {
			return t
		}
	}
	if q.resync() {
		return find(q.route)
	}
	return nil
}

// wait waits in the line for a place, activating the model when it has no
// ready instance. It returns nil when the request ended (answered).
func (q *request) wait(wt *admission.Waiter) *admission.Place {
	rt := q.rt
	ctx := q.r.Context()
	deadline := time.NewTimer(max(q.deadlineLeft(), 0))
	defer deadline.Stop()
	// The route table's change signal wakes the request the moment its
	// route changes (an instance ready, restarted, gone); the channel is
	// taken before the table is read again, so no change is missed.
	changed := rt.cfg.Routes.Changed()
	q.resync()
	var act chan error
	var actStart time.Time
	startAct := func() {
		if act != nil || ctx.Err() != nil {
			return
		}
		act = make(chan error, 1)
		actStart = time.Now()
		q.activated = true
		dep := q.route.Deployment
		go func() { act <- rt.lc.Activate(ctx, dep) }()
	}
	if !q.ds.adm.Ready() {
		if q.beyondBound(wt) {
			return nil
		}
		startAct()
	}
	var progress <-chan time.Time
	var progressTimer *time.Timer
	if q.stream && rt.cfg.ProgressAfter > 0 {
		progressTimer = time.NewTimer(rt.cfg.ProgressAfter)
		defer progressTimer.Stop()
		progress = progressTimer.C
	}
	for {
		select {
		case <-wt.C():
			if act != nil {
				q.activation += time.Since(actStart)
			}
			return wt.Place()
		case err := <-act:
			act = nil
			q.activation += time.Since(actStart)
			if err != nil {
				wt.Leave()
				if ctx.Err() != nil {
					q.gone()
				} else {
					q.fail(err)
				}
				return nil
			}
			if !q.resync() {
				wt.Leave()
				q.fail(structs.Errf(structs.CodeUnknownModel, "model %q was deleted", q.model))
				return nil
			}
		case <-changed:
			changed = rt.cfg.Routes.Changed()
			if q.resync() && act == nil && !q.ds.adm.Ready() {
				if q.beyondBound(wt) {
					return nil
				}
				startAct()
			}
		case <-deadline.C:
			wt.Leave()
			if act != nil {
				q.fail(structs.Errf(structs.CodeUnavailable, "model %q did not become ready within the request deadline (%s)", q.model, q.b.deadline))
			} else {
				q.fail(structs.Errf(structs.CodeQueueFull, "no running place for model %q within the request deadline (%s)", q.model, q.b.deadline))
			}
			return nil
		case <-ctx.Done():
			wt.Leave()
			q.gone()
			return nil
		case <-progress:
			q.sendProgress(wt, act != nil)
			progressTimer.Reset(rt.cfg.ProgressEvery)
		}
	}
}

// sendProgress writes an SSE comment saying what the request waits for.
// The first one commits the answer to 200 text/event-stream: later errors
// travel inside the stream.
func (q *request) sendProgress(wt *admission.Waiter, activating bool) {
	state := "queued"
	if activating {
		state = q.rt.activationState(q.route.Deployment)
	}
	if !q.headersSent {
		// The head goes out now, through net/http; the stream can still
		// be taken over later, in the chunked coding net/http began.
		q.headViaHTTP = q.hjOK
		q.sseHeaders()
	}
	q.progressed = true
	b := make([]byte, 0, 128)
	b = append(b, ": capyctl progress {\"state\":\""...)
	b = append(b, state...)
	b = append(b, "\",\"deployment\":"...)
	b = strconv.AppendQuote(b, q.route.Deployment)
	b = append(b, ",\"position\":"...)
	b = strconv.AppendInt(b, int64(max(wt.Position(), 0)), 10)
	b = append(b, ",\"elapsed_ms\":"...)
	b = strconv.AppendInt(b, time.Since(q.start).Milliseconds(), 10)
	if activating {
		if est, ok := q.estimate(); ok && est.Wait > 0 {
			b = append(b, ",\"eta_ms\":"...)
			b = strconv.AppendInt(b, est.Wait.Milliseconds(), 10)
			if est.Switch && len(est.Holding) > 0 {
				b = append(b, ",\"holding\":["...)
				for i, h := range est.Holding {
					if i > 0 {
						b = append(b, ',')
					}
					b = strconv.AppendQuote(b, h)
				}
				b = append(b, ']')
			}
		}
	}
	b = append(b, "}\n\n"...)
	q.write(b)
	if q.dl != nil {
		q.dl.progress(q) // dialect: its own keep-alive beside the comment
	}
	q.flush()
}

// estimate is the lifecycle's estimate of the request's wait, where it
// offers one.
func (q *request) estimate() (structs.WaitEstimate, bool) {
	ev, ok := q.rt.lc.(waitEstimator)
	if !ok {
		return structs.WaitEstimate{}, false
	}
	return ev.WaitEstimate(q.route.Deployment)
}

// beyondBound refuses, before its model is activated, a request whose
// model must wait for others to leave the card (their turns, the switch)
// longer than what is left of its deadline, by the measured figures alone:
// 429 insufficient_resources, Retry-After the expected wait, and details
// naming the models that hold the memory. A wait within the bound is not
// refused: the request waits.
func (q *request) beyondBound(wt *admission.Waiter) bool {
	est, ok := q.estimate()
	if !ok || !est.Switch || est.Floor <= 0 {
		return false
	}
	left := q.deadlineLeft()
	if est.Floor <= left {
		return false // IMPORTANT: never refused on a placeholder figure
	}
	wt.Leave()
	holding := "other models"
	if len(est.Holding) > 0 {
		holding = strings.Join(est.Holding, ", ")
	}
	e := structs.Errf(structs.CodeInsufficientResources,
		"model %q needs the memory %s hold: it is expected to serve in %s (%d models' turns first), past what is left of the request deadline (%s)",
		q.model, holding, est.Wait.Round(100*time.Millisecond), est.Ahead, left.Round(100*time.Millisecond))
	e.RetryAfter = max(int(math.Ceil(est.Wait.Seconds())), 1)
	e.WithDetail("holding", est.Holding).
		WithDetail("expected_wait_ms", est.Wait.Milliseconds()).
		WithDetail("turns_ahead", est.Ahead).
		WithDetail("deadline_left_ms", left.Milliseconds())
	q.fail(e)
	return true
}

// activationState names what an activation is doing, from the states of
// the deployment's instances where the lifecycle offers them.
func (rt *Router) activationState(dep string) string {
	v, ok := rt.lc.(instanceStates)
	if !ok {
		return "starting"
	}
	state := "starting"
	for _, st := range v.InstanceStates(dep) {
		switch st {
		case structs.StateWaking, structs.StateParked:
			return "waking"
		case structs.StateDraining, structs.StateParking, structs.StateStopping:
			state = "switching"
		}
	}
	return state
}

// sseHeaders commits the answer as a 200 event stream. Where the stream
// may be taken over, the head waits in the router's buffer with the first
// events until the first flush: net/http writes it for an answer complete
// by then, the router for one it takes over (hijack.go).
func (q *request) sseHeaders() {
	h := q.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	q.headersSent = true
	q.status = http.StatusOK
	q.sseOut = true
	if q.hjOK && q.stream {
		q.cw = cwPending
		return
	}
	q.w.WriteHeader(http.StatusOK)
}

// fail answers with an error: the envelope with its HTTP status, or, once
// the answer has started as a stream, an SSE error event and [DONE].
func (q *request) fail(err error) {
	e := structs.AsError(err)
	info := e.Info()
	if q.code == "" {
		q.code = string(e.Code)
	}
	if q.outcome == "" {
		q.outcome = OutcomeRefused
	}
	if q.dl != nil {
		q.dialectFail(e) // dialect: the error in the API's shape
		return
	}
	if q.headersSent {
		b := make([]byte, 0, 256)
		b = append(b, "data: "...)
		b = append(b, errorJSON(e, info)[:len(errorJSON(e, info))-1]...)
		b = append(b, "\n\ndata: [DONE]\n\n"...)
		q.write(b)
		q.flush()
		return
	}
	q.status = wire.HTTPStatus(e.Code)
	q.headersSent = true
	WriteError(q.w, e)
}

// gone records a client that went away.
func (q *request) gone() {
	if q.outcome == "" || q.outcome == OutcomeRefused {
		q.outcome = OutcomeCancelled
	}
}

// write sends bytes to the client; a failure ends the request's engine
// work through the caller.
func (q *request) write(b []byte) error {
	if q.cw != cwHTTP || q.sseOut {
		return q.writeOut(b)
	}
	n, err := q.w.Write(b)
	q.bytesOut += int64(n)
	if err != nil && q.writeErr == nil {
		q.writeErr = err
	}
	return err
}

// flush sends what is buffered to the client. A pending head goes to
// net/http here: the relay takes a stream over before its flush when the
// answer goes on (wantsTakeOver). The client read bound starts with the
// flush: a stream's next output (or its error event) may come long after
// the last one, and the client is not idle while the engine is.
func (q *request) flush() error {
	q.setWriteDeadline()
	switch q.cw {
	case cwHijacked:
		return q.flushOut(false)
	case cwPending:
		q.commitHTTP()
	case cwHTTP:
		if err := q.pushHTTP(); err != nil {
			return err
		}
	}
	return q.flushHTTP()
}

// setWriteDeadline bounds how long the client may take to accept what is
// written next. IMPORTANT: call it just before the write it bounds, never
// after the last one: the bound would then run while the router waits for
// the engine, and an engine slower than the bound would look like an idle
// client.
func (q *request) setWriteDeadline() {
	if q.cc != nil {
		if q.cc.conn != nil {
			_ = q.cc.conn.SetWriteDeadline(time.Now().Add(q.b.clientIdle))
		}
		return
	}
	if q.rc == nil {
		q.rc = http.NewResponseController(q.w)
	}
	_ = q.rc.SetWriteDeadline(time.Now().Add(q.b.clientIdle))
}

// settled is what the request used, for its key's limits and usage.
func (q *request) settled() structs.RequestUsage {
	u := structs.RequestUsage{Code: q.code, Duration: q.endAt.Sub(q.start)}
	if u.Code == "" && q.outcome != OutcomeCompleted {
		u.Code = q.outcome
	}
	if q.allowed {
		u.Model = q.model
	}
	if q.usage.known {
		u.UsageKnown = true
		u.PromptTokens, u.CompletionTokens = q.usage.prompt, q.usage.completion
		if q.usage.cachedOK {
			u.CachedTokens = q.usage.cached
		}
	}
	return u
}

// finish records the request: metrics and the ledger, after the answer
// reached the client.
func (q *request) finish() {
	if q.stopGone != nil {
		q.stopGone()
	}
	switch {
	case q.cc != nil:
		q.endTakenOver()
	case q.cw == cwPending:
		q.commitHTTP()
	case q.cw == cwHTTP:
		if len(q.out.data()) > 0 {
			q.setWriteDeadline()
		}
		_ = q.pushHTTP()
	}
	if q.rc != nil {
		// IMPORTANT: a deadline left on the connection would fail the
		// next request on the same keep-alive connection.
		_ = q.rc.SetWriteDeadline(time.Time{})
	}
	if q.endAt.IsZero() {
		q.endAt = time.Now()
	}
	if q.outcome == "" {
		q.outcome = OutcomeCompleted
	}
	q.rt.record(q)
	if m := q.caller.Meter; m != nil {
		m.Settle(q.settled())
	}
	if q.cc != nil {
		// IMPORTANT: after the record, so that a role whose Drain returned
		// has every taken-over stream's record before it closes the ledger.
		q.rt.streams.remove(q.cc)
	}
}
