// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package router is the inference hot path: resolve the model, admit the
// request (core/admission), activate the model when needed, forward the
// request to the engine's loopback endpoint over pooled keep-alive
// connections, relay the answer, and settle the request's place once there
// is evidence that the engine stopped working on it. It never calls a
// driver synchronously: aborts and idle readings go through the lifecycle
// off the hot path.
//
// Chat requests are always streamed from the engine, and aggregated for a
// client that did not ask for a stream: every engine stops a streamed
// request when its connection closes, while some (llama.cpp) keep working
// on an abandoned non-streamed one.
package router

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
)

// Header names.
const (
	// HeaderRequestID carries CapyCTL's ID of a request on every answer.
	HeaderRequestID = "X-CapyCTL-Request-Id"
	// HeaderClientRequestID is the client's own ID, echoed on the answer.
	HeaderClientRequestID = "X-Request-Id"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes   = 64 << 20
	DefaultDeadline       = 600 * time.Second
	DefaultStreamIdle     = 120 * time.Second
	DefaultClientReadIdle = 10 * time.Second
	DefaultMaxChunkBytes  = 64 << 10
	DefaultSettleInterval = 200 * time.Millisecond
	DefaultProgressAfter  = 250 * time.Millisecond
	// DefaultProgressEvery spaces a waiting stream's progress comments:
	// well within the 60 s read timeouts of nginx (proxy_read_timeout),
	// AWS load balancers and Cloud Run's defaults, which a stream that
	// sends nothing would hit during a long switch or cold start.
	DefaultProgressEvery = 10 * time.Second
	DefaultTakeOverAfter = 100 * time.Millisecond
)

// Lifecycle is what the router needs of the lifecycle on the hot path.
type Lifecycle interface {
	Activate(ctx context.Context, deployment string) error
}

// instanceStates is what an activation's progress comment reads of the
// lifecycle, where it offers it: the states of a deployment's instances.
type instanceStates interface {
	InstanceStates(deployment string) []structs.InstanceState
}

// waitEstimator is what a request for a model that is not in memory reads
// of the lifecycle, where it offers it: the expected wait, from the queue
// ahead and the measured wake and start times (a refusal's Retry-After, a
// progress comment's ETA).
type waitEstimator interface {
	WaitEstimate(deployment string) (structs.WaitEstimate, bool)
}

// Requests is what the router asks of the lifecycle off the hot path (see
// core/lifecycle/requests.go); *lifecycle.Manager implements it.
type Requests interface {
	Abort(ctx context.Context, instanceID, requestID string) (bool, error)
	Load(ctx context.Context, instanceID string) (routes.InstanceLoad, error)
	InstanceRun(instanceID string) (uint64, structs.InstanceState, bool)
	RestartForSettlement(instanceID string)
}

// RequestLog receives one record per request (store.RequestWriter). Record
// must never block. ("Ledger" is the memory ledger's word; the records of
// requests are a log. The role's setting keeps its name, request_ledger.)
type RequestLog interface {
	Record(structs.RequestRecord)
}

// Config configures a Router.
type Config struct {
	Lifecycle Lifecycle
	// Routes is where the lifecycle publishes its route tables (default:
	// the Lifecycle's Board, where it has one).
	Routes *routes.Board
	// Admission holds the places and lines of every deployment; the agent
	// builds it and hands it to the lifecycle too. nil: the router builds
	// its own (tests, benchmarks), whose saturation restarts through
	// Requests.
	Admission *admission.Controller
	// Requests defaults to Lifecycle when it implements Requests.
	Requests Requests
	// RequestLog receives request records; nil records nothing.
	RequestLog RequestLog
	Logger     hclog.Logger
	// MaxBodyBytes bounds a request body (default 64 MiB).
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the bytes of request bodies held in
	// memory, all requests together: being received, waiting for a place
	// or for the engine (default 256 MiB; past it 429
	// bodies_in_flight_full).
	MaxBodyBytesInFlight int64
	// BodyReadTimeout bounds the time a whole request body may take to
	// arrive (default 60s; past it 408 body_read_timeout).
	BodyReadTimeout time.Duration
	// DefaultDeadline bounds a request until its first output when the
	// deployment does not set its own (default 600s).
	DefaultDeadline time.Duration
	// MaxWaitingTotal and MaxWaitingBytes bound the requests waiting for a
	// place, all deployments together (256 and 64 MiB by default).
	MaxWaitingTotal int
	MaxWaitingBytes int64
	// SettleInterval is how often cut requests are checked against the
	// engines' idle readings and stops (default 200ms).
	SettleInterval time.Duration
	// SettleTransit is how long after a cut an engine's idle reading must
	// begin to settle it (admission.DefaultTransit when 0; negative: none).
	SettleTransit time.Duration
	// ProgressAfter is how long a streamed request waits for an activation
	// before CapyCTL answers 200 and starts sending SSE progress comments
	// (default 250ms; negative: never).
	ProgressAfter time.Duration
	// ProgressEvery spaces the progress comments, which keep proxies and
	// clients that time out on silence from cutting a waiting stream
	// (default 10s; limits.progress_interval).
	ProgressEvery time.Duration
	// Responses keeps the Responses API's stored responses (nil: none
	// kept; a request's store reads false and previous_response_id finds
	// nothing).
	Responses ResponseStore
	// KeepStreamsOnNetHTTP relays every answer on its net/http handler, as
	// before streams were taken over (hijack.go): about 20 KiB more per
	// open stream. For comparisons in the same run (make bench).
	KeepStreamsOnNetHTTP bool
	// Collectors are more of the role's metrics, served beside the
	// router's own on /metrics (the agent adds the lifecycle's start slots
	// and port leases).
	Collectors []prometheus.Collector
	// TakeOverAfter is how long a stream runs on its net/http handler
	// before the router takes its connection over, at its first flush
	// after that (hijack.go; default 100ms; negative: at its first flush).
	TakeOverAfter time.Duration
}

// Router serves the inference API's model routes.
type Router struct {
	cfg    Config
	lc     Lifecycle
	req    Requests
	logger hclog.Logger
	engine *engineClient
	adm    *admission.Controller
	stats  *stats

	bodies  bodyBudget  // bytes of request bodies held (body.go)
	deps    sync.Map    // deployment name -> *depState
	streams streamSet   // streams taken over from net/http (hijack.go)
	targets targetCache // parsed engine URLs (forward.go)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a Router and starts its settlement loop (Close stops it).
func New(cfg Config) *Router {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBodyBytesInFlight <= 0 {
		cfg.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if cfg.DefaultDeadline <= 0 {
		cfg.DefaultDeadline = DefaultDeadline
	}
	if cfg.SettleInterval <= 0 {
		cfg.SettleInterval = DefaultSettleInterval
	}
	if cfg.ProgressAfter == 0 {
		cfg.ProgressAfter = DefaultProgressAfter
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = DefaultProgressEvery
	}
	if cfg.TakeOverAfter == 0 {
		cfg.TakeOverAfter = DefaultTakeOverAfter
	}
	if cfg.Requests == nil {
		if r, ok := cfg.Lifecycle.(Requests); ok {
			cfg.Requests = r
		}
	}
	if cfg.Routes == nil {
		if b, ok := cfg.Lifecycle.(interface{ Board() *routes.Board }); ok {
			cfg.Routes = b.Board()
		} else {
			cfg.Routes = &routes.Board{}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &Router{
		cfg:    cfg,
		lc:     cfg.Lifecycle,
		req:    cfg.Requests,
		logger: cfg.Logger.Named("router"),
		engine: newEngineClient(1024),
		stats:  newStats(),
		bodies: bodyBudget{limit: cfg.MaxBodyBytesInFlight},
		ctx:    ctx,
		cancel: cancel,
	}
	rt.adm = cfg.Admission
	if rt.adm == nil {
		rt.adm = admission.New(admission.Config{
			MaxWaitingTotal: cfg.MaxWaitingTotal,
			MaxWaitingBytes: cfg.MaxWaitingBytes,
			Transit:         cfg.SettleTransit,
			OnSaturated:     rt.onSaturated,
		})
	}
	rt.stats.reg.MustRegister(&gauges{rt: rt})
	rt.stats.reg.MustRegister(cfg.Collectors...)
	rt.wg.Add(2)
	go rt.settleLoop()
	go rt.watchRoutes()
	return rt
}

// Close cuts the streams still open on connections taken over from
// net/http (Drain with no time left), stops the settlement loop and drops
// idle engine connections.
func (rt *Router) Close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rt.Drain(ctx)
	rt.cancel()
	rt.wg.Wait()
	rt.adm.Close()
	rt.engine.closeIdle()
}

// InFlight returns the number of requests holding a place, cut requests
// waiting to settle included.
func (rt *Router) InFlight() int64 {
	var n int64
	for _, d := range rt.adm.Deployments() {
		c := d.Counts()
		n += int64(c.Live + c.SettleWhenIdle + c.SettleAtStop + c.SettleOnAbort)
	}
	return n
}

// NewRequestID returns a fresh request ID ("capy-" and 24 hex digits).
func NewRequestID() string {
	const hexd = "0123456789abcdef"
	var b [29]byte
	copy(b[:], "capy-")
	a, c := rand.Uint64(), rand.Uint32()
	for i := 0; i < 16; i++ {
		b[5+i] = hexd[a>>(60-4*i)&0xf]
	}
	for i := 0; i < 8; i++ {
		b[21+i] = hexd[c>>(28-4*i)&0xf]
	}
	return string(b[:])
}

// ValidClientRequestID reports whether a client's X-Request-Id may be echoed:
// 1–128 printable ASCII characters without spaces.
func ValidClientRequestID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// WriteError writes the inference API's error envelope. Every 429 carries
// Retry-After.
func WriteError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	info := e.Info()
	status := wire.HTTPStatus(e.Code)
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	} else if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorJSON(e, info))
}

// errorJSON is the envelope {"error":{"code","message","retryable"}}, with
// "details" when the refusal has figures (a capacity refusal's memory, a
// switch wait's holding models and expected wait).
func errorJSON(e *structs.Error, info structs.CodeInfo) []byte {
	body := map[string]any{"code": string(e.Code), "message": e.Message, "retryable": info.Retryable}
	if len(e.Details) > 0 {
		body["details"] = e.Details
	}
	b, err := json.Marshal(map[string]any{"error": body})
	if err != nil {
		delete(body, "details")
		b, _ = json.Marshal(map[string]any{"error": body})
	}
	return append(b, '\n')
}

// Models serves GET /v1/models: every route, never waking anything.
func (rt *Router) Models(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID      string         `json:"id"`
		Object  string         `json:"object"`
		Created int64          `json:"created"`
		OwnedBy string         `json:"owned_by"`
		CapyCTL map[string]any `json:"capyctl"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	caller := CallerOf(r.Context())
	for _, route := range rt.cfg.Routes.Load().List() {
		state := "stopped"
		switch {
		case len(route.Ready) > 0:
			state = "ready"
		case route.Desired == structs.DesiredStopped:
			state = "stopped"
		default:
			state = "on_demand"
		}
		api := route.API
		if api == "" {
			api = structs.APIChat
		}
		names := route.Routes
		if len(names) == 0 {
			names = []string{route.Deployment}
		}
		for _, name := range names {
			if !caller.Allows(name) {
				continue // a key sees only the models it may use
			}
			out.Data = append(out.Data, model{
				ID: name, Object: "model", OwnedBy: "capyctl",
				CapyCTL: map[string]any{"api": api, "deployment": route.Deployment, "state": state, "endpoints": Endpoints(api)},
			})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// ChatCompletions serves POST /v1/chat/completions.
func (rt *Router) ChatCompletions(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, structs.APIChat)
}

// Completions serves POST /v1/completions (text completions), to chat
// deployments.
func (rt *Router) Completions(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, structs.APICompletions)
}

// Embeddings serves POST /v1/embeddings, to embeddings deployments: a
// whole JSON answer, never streamed.
func (rt *Router) Embeddings(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, structs.APIEmbeddings)
}

// Rerank serves POST /v1/rerank, to rerank deployments: a whole JSON
// answer, never streamed.
func (rt *Router) Rerank(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, structs.APIRerank)
}

// Decisions serves POST /v1/systemone (decision requests, sdk/decisions).
func (rt *Router) Decisions(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, structs.APIDecisions)
}
