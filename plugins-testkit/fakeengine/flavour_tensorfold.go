// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// TensorFoldVersion is the version the fake reports.
const TensorFoldVersion = "0.6.6"

// TensorFoldOptions are the `tensorfold serve` settings the flavour
// honours.
type TensorFoldOptions struct {
	// Context is --context, the longest request.
	Context int
	// Parallel is --parallel, requests decoded together (8 by default).
	Parallel int
	// NoDrafts is --no-drafts.
	NoDrafts bool
	// KernelBuild is how long the first chat request waits while the CUDA
	// kernels build (TensorFold 0.6.1 and later build them on the first
	// request, not at startup).
	KernelBuild time.Duration
	// KernelBuildFile, when set, makes the kernel build last (after
	// KernelBuild) until this file exists: a test ends the build when it
	// wants to.
	KernelBuildFile string
	// MemoryCap is TENSORFOLD_CUDA_MEMORY_LIMIT_GB in bytes, 0 when unset.
	MemoryCap int64
}

// TensorFold is the TensorFold engine as its release notes describe it:
//
//	GET  /health               {"ok":true,"status":"ready","requests_running":N,"requests_waiting":W,"busy":B}
//	                           (503 {"ok":false,"status":"loading"} while loading)
//	GET  /v1/models            owned_by "tensorfold", max_model_len
//	POST /v1/chat/completions  OpenAI chat; answers carry a "tensorfold" object (prefill_ms)
//	GET  /metrics              tensorfold:requests_running, _waiting, kv_cache_usage_ratio
//
// The first chat request waits out the kernel build (KernelBuild), with
// /health reporting busy. With TENSORFOLD_API_KEY set, every route needs
// the key, /health and /metrics included (why CapyCTL reserves it).
// SIGTERM exits 0.
type TensorFold struct {
	OpenAI
	opts TensorFoldOptions

	buildOnce sync.Mutex
	built     atomic.Bool
	building  atomic.Bool
	builds    atomic.Int64
}

var _ Flavour = (*TensorFold)(nil)

func init() {
	RegisterFlavour("tensorfold", func() Flavour { return NewTensorFold(TensorFoldOptions{}) })
}

// NewTensorFold returns the flavour.
func NewTensorFold(o TensorFoldOptions) *TensorFold {
	if o.Parallel <= 0 {
		o.Parallel = 8
	}
	return &TensorFold{opts: o}
}

// Options returns the flavour's settings.
func (t *TensorFold) Options() TensorFoldOptions { return t.opts }

// KernelBuilds counts the kernel builds done (0 or 1).
func (t *TensorFold) KernelBuilds() int64 { return t.builds.Load() }

// Name is "tensorfold".
func (t *TensorFold) Name() string { return "tensorfold" }

// Routes lists TensorFold's routes.
func (t *TensorFold) Routes(e *Engine) []Route {
	chat := e.ChatHandler()
	return []Route{
		{Pattern: "GET /health", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.health(e, w) })},
		{Pattern: "GET /v1/models", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.models(e, w) })},
		{Pattern: "POST /v1/chat/completions", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if e.Phase() != PhaseLoading && !t.waitKernels(e, r.Context()) {
				return // the client went away during the build
			}
			chat.ServeHTTP(w, r)
		})},
		{Pattern: "POST /v1/completions", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if e.Phase() != PhaseLoading && !t.waitKernels(e, r.Context()) {
				return // the client went away during the build
			}
			e.CompletionsHandler().ServeHTTP(w, r)
		})},
		{Pattern: "GET /metrics", Handler: MetricsHandler(e, t.metrics)},
		{Pattern: "GET /fake/stats", Handler: e.StatsHandler()},
	}
}

// Middleware requires the key on every route when one is set.
func (t *TensorFold) Middleware(e *Engine, next http.Handler) http.Handler {
	deny := func(w http.ResponseWriter, r *http.Request) { t.WriteError(w, KindUnauthorized, "invalid api key") }
	return APIKeyMiddleware(e.Config().APIKey, nil, nil, deny)(next)
}

// AcceptWhileLoading is true: /health answers (503) while loading.
func (t *TensorFold) AcceptWhileLoading() bool { return true }

// FormatLog writes "2006-01-02T15:04:05Z INFO tensorfold: message".
func (t *TensorFold) FormatLog(ts time.Time, level Level, msg string) string {
	return fmt.Sprintf("%s %s tensorfold: %s", ts.UTC().Format(time.RFC3339), level, msg)
}

// waitKernels builds the kernels on the first request (once, whatever
// the number of requests waiting for it). It returns false when ctx ends
// first; the build goes on for the next request.
func (t *TensorFold) waitKernels(e *Engine, ctx context.Context) bool {
	if t.built.Load() {
		return true
	}
	done := make(chan struct{})
	go func() {
		t.buildOnce.Lock()
		defer t.buildOnce.Unlock()
		defer close(done)
		if t.built.Load() {
			return
		}
		t.building.Store(true)
		e.Logf(LevelInfo, "building CUDA kernels for the first request (this takes a while once)")
		if !t.build(e.life) {
			t.building.Store(false)
			return
		}
		t.builds.Add(1)
		t.built.Store(true)
		t.building.Store(false)
		e.Logf(LevelInfo, "kernels ready")
	}()
	select {
	case <-done:
		return t.built.Load()
	case <-ctx.Done():
		return false
	}
}

// build waits out the kernel build; false when the engine stops first.
func (t *TensorFold) build(life context.Context) bool {
	if d := t.opts.KernelBuild; d > 0 {
		select {
		case <-time.After(d):
		case <-life.Done():
			return false
		}
	}
	if p := t.opts.KernelBuildFile; p != "" {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := os.Stat(p); err == nil {
				return true
			}
			select {
			case <-tick.C:
			case <-life.Done():
				return false
			}
		}
	}
	return true
}

func (t *TensorFold) health(e *Engine, w http.ResponseWriter) {
	if e.Phase() == PhaseLoading {
		WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "status": "loading"})
		return
	}
	s := e.Stats()
	running := s.Running
	if t.building.Load() && running == 0 {
		running = 1
	}
	WriteJSON(w, http.StatusOK, map[string]any{
		"ok": true, "status": "ready", "requests_running": running, "requests_waiting": s.Waiting,
		"busy": running > 0 || s.Waiting > 0,
	})
}

func (t *TensorFold) models(e *Engine, w http.ResponseWriter) {
	if e.Phase() == PhaseLoading {
		t.WriteError(w, KindLoading, "model is loading")
		return
	}
	WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": e.ServedName(), "object": "model", "created": e.Created().Unix(), "owned_by": "tensorfold", "max_model_len": t.opts.Context,
	}}})
}

func (t *TensorFold) metrics(s Stats) []Metric {
	kv := 0.0
	if s.MaxRunning > 0 {
		kv = float64(s.Running) / float64(s.MaxRunning)
	}
	return []Metric{
		{Name: TensorFoldFacts.Running.Value, Type: "gauge", Help: "Requests decoding now.", Value: float64(s.Running)},
		{Name: TensorFoldFacts.Waiting.Value, Type: "gauge", Help: "Requests waiting for a stream.", Value: float64(s.Waiting)},
		{Name: TensorFoldFacts.KVUsage.Value, Type: "gauge", Help: "KV cache in use.", Value: kv},
		{Name: "tensorfold:requests_total", Type: "counter", Help: "Requests accepted.", Value: float64(s.Total)},
		{Name: "tensorfold:generation_tokens_total", Type: "counter", Help: "Tokens generated.", Value: float64(s.GenerationTokens)},
	}
}

// PrepareChat requires the served name, as TensorFold does.
func (t *TensorFold) PrepareChat(e *Engine, r *http.Request, req *ChatRequest) error {
	if req.Model != e.ServedName() {
		return &APIError{Kind: KindModelNotFound, Message: fmt.Sprintf("model %q is not served here", req.Model)}
	}
	req.ResponseModel = req.Model
	return nil
}

// tensorFoldFigures are the engine's own figures in an answer.
type tensorFoldFigures struct {
	PrefillMS float64 `json:"prefill_ms"`
}

// ChatResponse is an OpenAI chat.completion with the "tensorfold" object.
func (t *TensorFold) ChatResponse(res *ChatResult) any {
	type withFigures struct {
		ChatCompletion
		TensorFold tensorFoldFigures `json:"tensorfold"`
	}
	return withFigures{ChatCompletion: t.OpenAI.ChatResponse(res).(ChatCompletion), TensorFold: tensorFoldFigures{PrefillMS: float64(res.PromptTokens) * 0.05}}
}
