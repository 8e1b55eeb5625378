// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package fakeengine is a fake LLM inference engine that speaks an engine's
// HTTP API faithfully enough for CapyCTL's drivers, router and benchmarks to
// run against it without a GPU: an OpenAI-compatible chat endpoint with
// deterministic answers, a startup phase, a FIFO slot queue whose running
// and waiting counts are real, cancellation on client hang-up, failure
// knobs, Prometheus metrics and memory held on a simulated GPU (simgpu).
//
// What is common to all engines lives in Engine; how one engine family
// says it on the wire (routes, shapes, error envelopes, metric names,
// readiness, exit codes) is a Flavour. OpenAI is the generic flavour.
//
// A typical test:
//
//	e, _ := fakeengine.New(fakeengine.Config{ServedName: "m"})
//	ln, _ := fakeengine.Listen("tcp", "127.0.0.1:0")
//	go e.Serve(ctx, ln) // or httptest.NewServer(e.Handler()) plus go e.Run(ctx)
//	<-e.Ready()
package fakeengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for zero Config fields.
const (
	// DefaultTokens is the answer length when Config.Tokens is 0.
	DefaultTokens = 16
	// DefaultMaxRunning is the slot count when Config.MaxRunning is 0.
	DefaultMaxRunning = 32
	// DefaultShutdownGrace bounds a graceful shutdown.
	DefaultShutdownGrace = 5 * time.Second
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 32 << 20

// Config describes one fake engine. Only ServedName is required.
type Config struct {
	// ServedName is the model name the engine serves and lists.
	ServedName string
	// Flavour shapes the wire; nil means OpenAI{}.
	Flavour Flavour
	// APIKey, when set, is required by the routes the flavour guards.
	APIKey string

	// StartupDelay is how long the engine stays loading.
	StartupDelay time.Duration
	// HoldStartupFile, when set, keeps the engine loading (after
	// StartupDelay) until this file exists: a test releases a start
	// exactly when it wants to.
	HoldStartupFile string
	// ExitDuringStartup, when set, makes the engine log a failure and exit
	// with this code instead of becoming ready.
	ExitDuringStartup *int
	// HostAllocBytes of host memory are allocated and touched at startup
	// and kept, so that host-memory measurement has something to measure.
	HostAllocBytes int64
	// Sleep is what a sleep level costs and keeps (the vLLM flavour's
	// /sleep, /wake_up and reload_weights).
	Sleep SleepCosts

	// TokenRate is the generation speed in tokens per second; 0 means no
	// delay between tokens.
	TokenRate float64
	// StreamTokenRate, when above 0, is a streamed answer's speed instead
	// of TokenRate: a benchmark keeps thousands of streams open at a
	// chunk every few seconds while the driver's readiness probe (a short
	// answer, not streamed) is answered at TokenRate.
	StreamTokenRate float64
	// Tokens is the natural answer length (DefaultTokens when 0); a lower
	// max_tokens cuts it with finish_reason "length".
	Tokens int
	// Seed varies the deterministic answers.
	Seed uint64
	// WakeDrift makes every wake change the answers (as a model that wakes
	// wrongly would), so a wake check can be seen to fail.
	WakeDrift bool
	// MaxRunning requests generate at once (DefaultMaxRunning when 0);
	// the rest wait in FIFO order.
	MaxRunning int

	// CrashAfter, when positive, makes the engine exit with code 1 after
	// it has finished that many chat requests (whatever their outcome).
	CrashAfter int
	// FailRequests is how many of the next chat requests are answered with
	// an engine failure (HTTP 500), streamed ones included.
	FailRequests int
	// StallAfterTokens, when positive, makes a request stop producing
	// after that many tokens while keeping its connection open, until the
	// client goes away or the engine stops.
	StallAfterTokens int
	// BigChunkBytes, when positive, adds one content piece of that many
	// bytes at the start of every answer (one chunk when streamed), counted
	// as one token.
	BigChunkBytes int
	// CloseAfterStream closes the connection after every streamed answer,
	// although the answer's head advertises keep-alive, as llama-server
	// b4748 does (llamaserver-observed.md, "Connections after a streamed
	// answer"). The llama.cpp flavour always does; this knob makes any
	// flavour do it.
	CloseAfterStream bool

	// KVConnector, when set, is an external KV cache the engine uses as a
	// real engine uses LMCache: before prefill it looks up how much of the
	// prompt's prefix the cache holds (reported as cached tokens, not
	// prefilled), after prefill it stores the prompt's chunks.
	KVConnector KVConnector
	// ReportCachedTokens reports the cached part of a prompt as
	// usage.prompt_tokens_details.cached_tokens, as the real engines do
	// only when told to (vLLM --enable-prompt-tokens-details, SGLang
	// --enable-cache-report).
	ReportCachedTokens bool

	// LogSecret prints the API key at startup, so that log redaction can
	// be tested.
	LogSecret bool
	// Sim is the memory held on a simulated GPU.
	Sim SimConfig
	// Group, when set, makes the engine the head (rank 0) of a group
	// across machines: it loads only once every rank has joined on the
	// rendezvous address, is ready only once every rank has loaded, and
	// exits with code 1 when a rank goes away (see group.go). Park, Wake
	// and vLLM's reload_weights act on every rank and return once every
	// rank has acted. Workers run as a GroupWorker, not an Engine.
	Group *GroupConfig

	// Stdout receives info lines (os.Stdout when nil).
	Stdout io.Writer
	// Stderr receives warnings and errors (os.Stderr when nil).
	Stderr io.Writer
	// ShutdownGrace bounds how long Serve lets requests finish after its
	// context ends (DefaultShutdownGrace when 0).
	ShutdownGrace time.Duration
}

// Phase is where the engine is in its life.
type Phase int32

// Phases.
const (
	// PhaseLoading is the startup: the model is "loading".
	PhaseLoading Phase = iota
	// PhaseReady serves requests.
	PhaseReady
	// PhaseParked has released its GPU memory (Park); requests wait.
	PhaseParked
	// PhaseStopped has ended Run.
	PhaseStopped
)

// String names the phase.
func (p Phase) String() string {
	switch p {
	case PhaseLoading:
		return "loading"
	case PhaseReady:
		return "ready"
	case PhaseParked:
		return "parked"
	case PhaseStopped:
		return "stopped"
	}
	return fmt.Sprintf("phase_%d", int(p))
}

// ExitError is returned by Run and Serve when the simulated engine process
// must exit with Code: a startup failure, an out-of-memory at load, the
// crash-after knob. The binary exits with Code.
type ExitError struct {
	// Code is the exit status.
	Code int
	// Reason says why, for logs.
	Reason string
}

// Error implements error.
func (e *ExitError) Error() string {
	return fmt.Sprintf("engine exits with code %d: %s", e.Code, e.Reason)
}

// Stats is a snapshot of the engine's counters, also served as JSON on
// GET /fake/stats. Total = Completed + Cancelled + Failed + requests in
// flight.
type Stats struct {
	// Flavour is the flavour's name.
	Flavour string `json:"flavour"`
	// Phase is the engine's phase.
	Phase string `json:"phase"`
	// Running is the number of requests holding a slot.
	Running int `json:"running"`
	// Waiting is the number of requests queued for a slot.
	Waiting int `json:"waiting"`
	// MaxRunning is the slot count.
	MaxRunning int `json:"max_running"`
	// Total counts chat requests accepted (valid and for this model).
	Total uint64 `json:"total"`
	// Streamed counts the accepted chat requests that asked for a stream.
	Streamed uint64 `json:"streamed"`
	// Completed counts answers delivered in full.
	Completed uint64 `json:"completed"`
	// Cancelled counts requests ended early: client hang-up, Abort, or
	// engine shutdown, while waiting or generating.
	Cancelled uint64 `json:"cancelled"`
	// Failed counts requests answered with an injected engine failure.
	Failed uint64 `json:"failed"`
	// PromptTokens counts the prompt tokens of accepted requests.
	PromptTokens uint64 `json:"prompt_tokens"`
	// GenerationTokens counts tokens generated, cancelled requests' too.
	GenerationTokens uint64 `json:"generation_tokens"`
	// LastCancelUnixNano is when the engine last observed a cancellation
	// (0 if never): "client hang-up → engine slot idle" is measured from it.
	LastCancelUnixNano int64 `json:"last_cancel_unix_nano"`
	// Parks and Wakes count completed Park and Wake calls.
	Parks uint64 `json:"parks"`
	// Wakes counts completed Wake calls that made the engine ready.
	Wakes uint64 `json:"wakes"`
	// ParkLevel is the level of the current park (0 when not parked).
	ParkLevel int `json:"park_level"`
	// SimHeld is what the engine holds on the simulated GPU, per tag.
	SimHeld map[string]int64 `json:"sim_held,omitempty"`
}

// Engine is one fake engine. Create it with New, run it with Serve (or Run
// plus Handler on a server of your own).
type Engine struct {
	cfg     Config
	flavour Flavour
	created time.Time
	handler http.Handler
	slots   *slots
	mem     *simMemory

	phase   atomic.Int32
	started atomic.Bool
	ready   chan struct{}
	// listen, set by Serve for a flavour that serves only once ready, puts
	// its deferred listener in the listening state; Run calls it before it
	// says the engine is ready, so that Ready means a connection is taken.
	listen atomic.Pointer[func() error]
	fatal  chan *ExitError

	// life ends when Run returns; generation stops with it.
	life     context.Context
	endLife  context.CancelFunc
	hostMem  []byte
	failLeft atomic.Int64

	total, completed, cancelled, failed atomic.Uint64
	streamed                            atomic.Uint64
	activity                            atomic.Int64 // last result posted, Unix ns
	finished, promptTokens, genTokens   atomic.Uint64
	lastCancel                          atomic.Int64
	crashConn                           atomic.Pointer[net.Conn]

	inflightMu sync.Mutex
	inflight   map[*inflight]struct{}

	// group is the head's group once it serves: Park, Wake and the
	// flavours' collective calls carry their command out on every rank.
	group atomic.Pointer[groupHead]
	// peerLost is a lost rank + 1 under PeerLossHang (0: none lost); stuck
	// starts the collective timeout once.
	peerLost atomic.Int64
	stuck    sync.Once

	parkMu    sync.Mutex
	parkLevel int
	parked    map[string]bool // tags released by Park and not yet woken
	parks     atomic.Uint64
	wakes     atomic.Uint64

	logMu sync.Mutex
}

// inflight is one chat request between acceptance and its answer.
type inflight struct {
	id     string
	cancel context.CancelCauseFunc
}

// Causes of a cancelled generation other than the client going away.
var (
	errAborted  = errors.New("request aborted")
	errShutdown = errors.New("engine shutting down")
)

// New checks cfg and builds an engine in the loading phase. Nothing runs
// until Run or Serve.
func New(cfg Config) (*Engine, error) {
	if strings.TrimSpace(cfg.ServedName) == "" {
		return nil, errors.New("new fake engine: served name is required")
	}
	switch {
	case cfg.Tokens < 0:
		return nil, fmt.Errorf("new fake engine: tokens %d is negative", cfg.Tokens)
	case cfg.MaxRunning < 0:
		return nil, fmt.Errorf("new fake engine: max running %d is negative", cfg.MaxRunning)
	case cfg.TokenRate < 0:
		return nil, fmt.Errorf("new fake engine: token rate %v is negative", cfg.TokenRate)
	case cfg.StreamTokenRate < 0:
		return nil, fmt.Errorf("new fake engine: stream token rate %v is negative", cfg.StreamTokenRate)
	case cfg.CrashAfter < 0, cfg.FailRequests < 0, cfg.StallAfterTokens < 0, cfg.BigChunkBytes < 0, cfg.HostAllocBytes < 0:
		return nil, errors.New("new fake engine: knobs must not be negative")
	case cfg.StartupDelay < 0:
		return nil, errors.New("new fake engine: startup delay is negative")
	}
	if err := cfg.Sim.validate(); err != nil {
		return nil, fmt.Errorf("new fake engine: %w", err)
	}
	if g := cfg.Group; g != nil {
		if err := g.validate(); err != nil {
			return nil, fmt.Errorf("new fake engine: %w", err)
		}
		if g.Rank != 0 {
			return nil, fmt.Errorf("new fake engine: group rank %d is a worker (GroupWorker), not an engine", g.Rank)
		}
	}
	if cfg.Flavour == nil {
		cfg.Flavour = OpenAI{}
	}
	if cfg.Tokens == 0 {
		cfg.Tokens = DefaultTokens
	}
	if cfg.MaxRunning == 0 {
		cfg.MaxRunning = DefaultMaxRunning
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	e := &Engine{
		cfg:      cfg,
		flavour:  cfg.Flavour,
		created:  time.Now(),
		slots:    newSlots(cfg.MaxRunning),
		mem:      &simMemory{cfg: cfg.Sim, held: map[string]int64{}},
		ready:    make(chan struct{}),
		fatal:    make(chan *ExitError, 1),
		inflight: map[*inflight]struct{}{},
		parked:   map[string]bool{},
	}
	e.life, e.endLife = context.WithCancel(context.Background())
	e.failLeft.Store(int64(cfg.FailRequests))
	h, err := e.buildHandler()
	if err != nil {
		return nil, fmt.Errorf("new fake engine: %w", err)
	}
	e.handler = h
	return e, nil
}

// buildHandler routes the flavour's routes, adds the engine's own and
// wraps the result in the flavour's middleware.
func (e *Engine) buildHandler() (h http.Handler, err error) {
	defer func() {
		if r := recover(); r != nil { // http.ServeMux panics on bad patterns
			err = fmt.Errorf("flavour %s routes: %v", e.flavour.Name(), r)
		}
	}()
	mux := http.NewServeMux()
	have := map[string]bool{}
	for _, r := range e.flavour.Routes(e) {
		mux.Handle(r.Pattern, r.Handler)
		have[r.Pattern] = true
	}
	if !have["GET /fake/stats"] {
		mux.Handle("GET /fake/stats", e.StatsHandler())
	}
	if !have["/"] {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			e.flavour.WriteError(w, KindRouteNotFound, "Not Found")
		})
	}
	h = e.flavour.Middleware(e, mux)
	if al, ok := e.flavour.(AccessLogger); ok {
		h = e.accessLog(al, h)
	}
	return h, nil
}

// Handler is the engine's HTTP handler: the flavour's routes behind its
// middleware. It answers as loading until Run has finished the startup.
func (e *Engine) Handler() http.Handler { return e.handler }

// Flavour is the engine's flavour.
func (e *Engine) Flavour() Flavour { return e.flavour }

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// ServedName is the served model name.
func (e *Engine) ServedName() string { return e.cfg.ServedName }

// Created is when the engine was built ("created" of its model card).
func (e *Engine) Created() time.Time { return e.created }

// Phase is the engine's current phase.
func (e *Engine) Phase() Phase { return Phase(e.phase.Load()) }

// Ready is closed when the startup has finished and the engine serves.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// Logf writes one log line in the flavour's format: info to Stdout,
// warnings and errors to Stderr. Never log prompt text.
func (e *Engine) Logf(level Level, format string, args ...any) {
	line := e.flavour.FormatLog(time.Now(), level, fmt.Sprintf(format, args...))
	e.writeLog(level, line)
}

// writeLog writes a preformatted line.
func (e *Engine) writeLog(level Level, line string) {
	w := e.cfg.Stdout
	if level != LevelInfo {
		w = e.cfg.Stderr
	}
	e.logMu.Lock()
	defer e.logMu.Unlock()
	io.WriteString(w, line+"\n")
}

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	running, waiting := e.slots.counts()
	e.parkMu.Lock()
	level := e.parkLevel
	e.parkMu.Unlock()
	return Stats{
		Flavour:            e.flavour.Name(),
		Phase:              e.Phase().String(),
		Running:            running,
		Waiting:            waiting,
		MaxRunning:         e.cfg.MaxRunning,
		Total:              e.total.Load(),
		Streamed:           e.streamed.Load(),
		Completed:          e.completed.Load(),
		Cancelled:          e.cancelled.Load(),
		Failed:             e.failed.Load(),
		PromptTokens:       e.promptTokens.Load(),
		GenerationTokens:   e.genTokens.Load(),
		LastCancelUnixNano: e.lastCancel.Load(),
		Parks:              e.parks.Load(),
		Wakes:              e.wakes.Load(),
		ParkLevel:          level,
		SimHeld:            e.mem.snapshot(),
	}
}

// StatsHandler serves Stats as JSON (GET /fake/stats).
func (e *Engine) StatsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, e.Stats())
	})
}

// Run plays the engine's life without HTTP: the startup (host memory,
// simulated GPU memory, the delay, the hold file, a scripted startup
// failure), the ready phase, and the end. It returns nil when ctx ends and
// an *ExitError when the engine must exit (startup failure, out of memory,
// crash-after). Memory held on the simulated GPU is freed on return. Run
// may be called once.
func (e *Engine) Run(ctx context.Context) error {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("run fake engine: already run")
	}
	defer e.stop()
	e.Logf(LevelInfo, "starting %s fake engine: served model %q, %d slots", e.flavour.Name(), e.cfg.ServedName, e.cfg.MaxRunning)
	if e.cfg.LogSecret {
		e.Logf(LevelInfo, "api key: %s", e.cfg.APIKey)
	}
	if n := e.cfg.HostAllocBytes; n > 0 {
		e.hostMem = make([]byte, n)
		for i := int64(0); i < n; i += 4096 {
			e.hostMem[i] = 1
		}
		e.Logf(LevelInfo, "holding %s of host memory", FormatBytes(n))
	}
	var group *groupHead
	if e.cfg.Group != nil {
		// The ranks meet before anyone loads, as torch.distributed's
		// process group is set up before the model is.
		g, err := e.runGroupHead(ctx)
		if g == nil {
			return err // nil when ctx ended
		}
		group = g
		defer group.close()
	}
	e.Logf(LevelInfo, "loading model %s", e.cfg.ServedName)
	if err := e.loadSim(); err != nil {
		return err
	}
	if err := e.waitStartup(ctx); err != nil {
		return nil // ctx ended during startup: a shutdown, not a failure
	}
	if group != nil {
		if err := group.waitLoaded(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			e.Logf(LevelError, "%v", err)
			return &ExitError{Code: 1, Reason: err.Error()}
		}
	}
	if code := e.cfg.ExitDuringStartup; code != nil {
		e.Logf(LevelInfo, "initialising engine core")
		e.Logf(LevelError, "engine core initialisation failed: simulated startup failure (exit code %d)", *code)
		return &ExitError{Code: *code, Reason: "exit during startup"}
	}
	if err := e.mem.free(TagStartupPeak); err != nil {
		e.Logf(LevelWarn, "free startup peak: %v", err)
	}
	// The line comes first, so that whoever sees the engine ready (health,
	// Ready) also finds the line in its log.
	var lost <-chan int // nil, so never ready, without a group
	if group != nil {
		if err := group.broadcast("serving"); err != nil {
			e.Logf(LevelError, "%v", err)
			return &ExitError{Code: 1, Reason: err.Error()}
		}
		group.watch()
		lost = group.lost
		e.group.Store(group)
	}
	if f := e.listen.Load(); f != nil {
		if err := (*f)(); err != nil {
			e.Logf(LevelError, "%v", err)
			return &ExitError{Code: 1, Reason: err.Error()}
		}
	}
	e.Logf(LevelInfo, "ready: serving %s", e.cfg.ServedName)
	e.phase.Store(int32(PhaseReady))
	close(e.ready)
	select {
	case <-ctx.Done():
		e.Logf(LevelInfo, "shutting down")
		return nil
	case x := <-e.fatal:
		e.Logf(LevelError, "%s", x.Reason)
		return x
	case rank := <-lost:
		if e.cfg.Group.PeerLoss == PeerLossHang {
			// Nothing notices yet: the head serves on until a
			// collective needs the lost rank (groupCall, and a
			// request's model step: startCollectiveTimeout). The
			// line is the fake's own, for tests to wait on.
			e.peerLost.Store(int64(rank) + 1)
			e.Logf(LevelInfo, "fake: group rank %d's connection closed; the engine does not notice until its next collective", rank)
			select {
			case <-ctx.Done():
				e.Logf(LevelInfo, "shutting down")
				return nil
			case x := <-e.fatal:
				e.Logf(LevelError, "%s", x.Reason)
				return x
			}
		}
		// The head's next collective cannot complete, and the engine
		// notices at once (PeerLossExit).
		line := e.cfg.Group.lostLine(rank)
		e.Logf(LevelError, "%s", line)
		return &ExitError{Code: 1, Reason: line}
	}
}

// groupStuck reports whether a rank of the head's group is gone under
// PeerLossHang: its collectives cannot complete.
func (e *Engine) groupStuck() bool { return e.peerLost.Load() > 0 }

// startCollectiveTimeout starts, once, the group's collective timeout,
// after which the engine exits with code 1 (StuckLog), which ends every
// waiter.
func (e *Engine) startCollectiveTimeout() {
	e.stuck.Do(func() {
		g := e.cfg.Group
		t := time.AfterFunc(g.collectiveTimeout(), func() {
			msg := g.StuckLog
			if msg == "" {
				msg = fmt.Sprintf("a collective waited %s for a group rank that is gone", g.collectiveTimeout())
			}
			e.exit(&ExitError{Code: 1, Reason: msg})
		})
		context.AfterFunc(e.life, func() { t.Stop() })
	})
}

// waitStartup waits for the startup delay and the hold file.
func (e *Engine) waitStartup(ctx context.Context) error {
	if d := e.cfg.StartupDelay; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if p := e.cfg.HoldStartupFile; p != "" {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
	return nil
}

// stop ends the engine's life: generation stops and memory is freed.
func (e *Engine) stop() {
	e.phase.Store(int32(PhaseStopped))
	e.endLife()
	e.mem.freeAll()
	e.hostMem = nil
}

// exit asks Run to end with x (the first request wins).
func (e *Engine) exit(x *ExitError) {
	select {
	case e.fatal <- x:
	default:
	}
}

// Serve serves the engine's API on ln and runs its life (Run). The port is
// bound already, so a client can connect during the startup; whether it is
// answered then is the flavour's AcceptWhileLoading. When ctx ends, Serve
// stops accepting, lets requests finish for up to ShutdownGrace, stops the
// engine and returns nil. When the engine must exit (see Run), Serve drops
// every connection at once, as a crash would, and returns the *ExitError.
// Serve closes ln.
func (e *Engine) Serve(ctx context.Context, ln net.Listener) error {
	defer ln.Close()
	// Connections that never sent a request (a client's spare, dialed
	// while another connection came free) are not idle to Shutdown, which
	// waits five seconds for their first request: they are closed at once.
	var freshMu sync.Mutex
	fresh := map[net.Conn]bool{}
	closeFresh := func() {
		freshMu.Lock()
		defer freshMu.Unlock()
		for c := range fresh {
			_ = c.Close()
			delete(fresh, c)
		}
	}
	srv := &http.Server{
		Handler:           e.handler,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(e.cfg.Stderr, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			freshMu.Lock()
			if st == http.StateNew {
				fresh[c] = true
			} else {
				delete(fresh, c)
			}
			freshMu.Unlock()
			// The request that reached crash-after has been answered in
			// full once its connection is idle or closed.
			if st == http.StateIdle || st == http.StateClosed || st == http.StateHijacked {
				if p := e.crashConn.Load(); p != nil && *p == c {
					e.crash()
				}
			}
		},
	}
	if e.flavour.AcceptWhileLoading() {
		// A deferred listener (Listen) must listen before the log says so.
		if d, ok := ln.(*deferredListener); ok {
			if _, err := d.listening(); err != nil {
				return fmt.Errorf("serve fake engine: %w", err)
			}
		}
	}
	if d, ok := ln.(*deferredListener); ok && !e.flavour.AcceptWhileLoading() {
		listen := func() error {
			_, err := d.listening()
			return err
		}
		e.listen.Store(&listen)
	}
	e.Logf(LevelInfo, "listening on %s", ln.Addr())

	// Run outlives ctx by the grace period, so that requests in flight can
	// finish: it is stopped after the HTTP server.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	runErr := make(chan error, 1)
	go func() { runErr <- e.Run(runCtx) }()

	serveErr := make(chan error, 1)
	serve := func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	}
	if e.flavour.AcceptWhileLoading() {
		go serve()
	} else {
		go func() {
			select {
			case <-e.ready:
				serve()
			case <-runCtx.Done():
			}
		}()
	}

	select {
	case <-ctx.Done():
		grace, cancel := context.WithTimeout(context.Background(), e.cfg.ShutdownGrace)
		defer cancel()
		shut := make(chan error, 1)
		go func() { shut <- srv.Shutdown(grace) }()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
	shutdown:
		for {
			closeFresh()
			select {
			case err := <-shut:
				if err != nil {
					srv.Close()
				}
				break shutdown
			case <-tick.C:
			}
		}
		cancelRun()
		err := <-runErr
		e.Logf(LevelInfo, "stopped")
		return err
	case err := <-runErr: // only an exit ends Run before ctx does
		srv.Close()
		return err
	case err := <-serveErr:
		srv.Close()
		cancelRun()
		<-runErr
		return fmt.Errorf("serve fake engine: %w", err)
	}
}
