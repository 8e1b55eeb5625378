// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/sdk/decisions"
)

// DefaultSGLangVersion is what the SGLang flavour reports when told nothing.
const DefaultSGLangVersion = "0.5.22"

// SGLangOptions are what an SGLang launch decides with its argv.
type SGLangOptions struct {
	// Version is reported by /get_server_info (DefaultSGLangVersion when
	// empty).
	Version string
	// ModelPath is --model-path.
	ModelPath string
	// ContextLength is max_model_len on the model card.
	ContextLength int
	// Metrics is --enable-metrics: without it /metrics is 404.
	Metrics bool
	// MemorySaver is --enable-memory-saver: without it
	// release_memory_occupation logs a warning and frees nothing.
	MemorySaver bool
	// WeightsCPUBackup is --enable-weights-cpu-backup: released weights
	// keep a copy in host RAM and resume restores them; without it resumed
	// weights are garbage until update_weights_from_disk.
	WeightsCPUBackup bool
	// TokenizerWorkers is --tokenizer-worker-num.
	TokenizerWorkers int
	// Plugins are the plugins the launch loaded (for /get_server_info).
	Plugins []string
}

// SGLang is the SGLang flavour (python -m sglang.launch_server, 0.5.20 to
// 0.5.22):
//
//	GET  /health, /health_generate   503 once (Starting) when HTTP opens, then 200 empty; 503 while released
//	GET  /get_model_info, /get_server_info, /server_info, /get_load, /ping
//	GET  /v1/models[/{model}]         owned_by "sglang", root, max_model_len
//	POST /v1/chat/completions         the request ID is the body's "rid"; JSON only (400 otherwise)
//	POST /v1/completions              text completions (completions.go), the same "rid"
//	POST /v1/embeddings               embeddings (embeddings.go), no id in the answer
//	POST /v1/systemone                decision requests (rid in the body)
//	GET|POST /flush_cache             400 while requests run or wait
//	POST /abort_request               {"rid": "...", "abort_all": false}
//	GET|POST /release_memory_occupation, /resume_memory_occupation  {"tags": [...]}
//	POST /update_weights_from_disk    {"model_path": "..."}
//	POST /pause_generation, /continue_generation
//	GET  /metrics                     with --enable-metrics only: sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage, ...
//
// Everything but /health* and /metrics* needs the key (401
// {"error":"Unauthorized"}). The port refuses connections while loading.
// Releasing memory while requests run or wait is refused (400); requests
// sent while memory is released wait until it is resumed.
type SGLang struct {
	opts SGLangOptions

	mu       sync.Mutex
	started  bool // the first health check after HTTP opened has been answered
	dropped  bool // weights released without a CPU copy
	stale    bool // weights resumed without a reload: answers are garbage
	flushes  int
	releases int
}

var _ Flavour = (*SGLang)(nil)

func init() {
	RegisterFlavour("sglang", func() Flavour { return NewSGLang(SGLangOptions{Metrics: true, MemorySaver: true}) })
}

// NewSGLang returns an SGLang flavour.
func NewSGLang(o SGLangOptions) *SGLang {
	if o.Version == "" {
		o.Version = DefaultSGLangVersion
	}
	if o.TokenizerWorkers == 0 {
		o.TokenizerWorkers = 1
	}
	return &SGLang{opts: o}
}

// Options returns the flavour's options.
func (s *SGLang) Options() SGLangOptions { return s.opts }

// Name is "sglang".
func (s *SGLang) Name() string { return "sglang" }

// Routes lists SGLang's routes.
func (s *SGLang) Routes(e *Engine) []Route {
	h := func(f func(e *Engine, w http.ResponseWriter, r *http.Request)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(e, w, r) })
	}
	routes := []Route{
		{Pattern: "GET /health", Handler: h(s.health)},
		{Pattern: "GET /health_generate", Handler: h(s.health)},
		{Pattern: "GET /ping", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })},
		{Pattern: "GET /get_model_info", Handler: h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, http.StatusOK, map[string]any{"model_path": s.opts.ModelPath, "tokenizer_path": s.opts.ModelPath,
				"is_generation": true, "preferred_sampling_params": nil, "weight_version": "default"})
		})},
		{Pattern: "GET /get_server_info", Handler: h(s.serverInfo)},
		{Pattern: "GET /server_info", Handler: h(s.serverInfo)},
		{Pattern: "GET /get_load", Handler: h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
			st := e.Stats()
			WriteJSON(w, http.StatusOK, []map[string]any{{"dp_rank": 0, "num_reqs": st.Running + st.Waiting, "num_waiting_reqs": st.Waiting, "num_tokens": 0}})
		})},
		{Pattern: "GET /v1/models", Handler: h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{s.card(e)}})
		})},
		{Pattern: "GET /v1/models/{model}", Handler: h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
			if r.PathValue("model") != e.ServedName() {
				s.WriteError(w, KindModelNotFound, fmt.Sprintf("The model '%s' does not exist", r.PathValue("model")))
				return
			}
			WriteJSON(w, http.StatusOK, s.card(e))
		})},
		{Pattern: "POST /v1/chat/completions", Handler: jsonOnly(s, e.ChatHandler())},
		{Pattern: "POST /v1/completions", Handler: jsonOnly(s, e.CompletionsHandler())},
		{Pattern: "POST /v1/embeddings", Handler: jsonOnly(s, e.EmbeddingsHandler(false))},
		{Pattern: "POST /v1/systemone", Handler: jsonOnly(s, h(s.decide))},
		{Pattern: "GET /flush_cache", Handler: h(s.flushCache)},
		{Pattern: "POST /flush_cache", Handler: h(s.flushCache)},
		{Pattern: "POST /abort_request", Handler: h(s.abort)},
		{Pattern: "GET /release_memory_occupation", Handler: h(s.release)},
		{Pattern: "POST /release_memory_occupation", Handler: h(s.release)},
		{Pattern: "GET /resume_memory_occupation", Handler: h(s.resume)},
		{Pattern: "POST /resume_memory_occupation", Handler: h(s.resume)},
		{Pattern: "POST /update_weights_from_disk", Handler: h(s.updateWeights)},
		{Pattern: "POST /pause_generation", Handler: h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
			e.slots.setPaused(true)
			WriteJSON(w, http.StatusOK, map[string]string{"message": "Generation paused successfully.", "status": "ok"})
		})},
		{Pattern: "POST /continue_generation", Handler: h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
			if e.Phase() == PhaseReady {
				e.slots.setPaused(false)
			}
			WriteJSON(w, http.StatusOK, map[string]string{"message": "Generation continued successfully.", "status": "ok"})
		})},
		{Pattern: "GET /fake/stats", Handler: e.StatsHandler()},
	}
	if s.opts.Metrics {
		routes = append(routes, Route{Pattern: "GET /metrics", Handler: MetricsHandler(e, func(st Stats) []Metric { return SGLangMetrics(e.ServedName(), st) })})
	}
	return routes
}

// jsonOnly refuses a body that is not application/json, as SGLang's
// OpenAI routes do.
func jsonOnly(s *SGLang, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt != "application/json" {
			s.WriteError(w, KindInvalidRequest, "Unsupported Media Type: Only 'application/json' is allowed")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// card is the model card.
func (s *SGLang) card(e *Engine) map[string]any {
	return map[string]any{"id": e.ServedName(), "object": "model", "created": e.Created().Unix(), "owned_by": "sglang",
		"root": e.ServedName(), "max_model_len": s.opts.ContextLength}
}

// health answers /health: 503 the first time (the server is Starting), 503
// while memory is released (no generation can run), 200 otherwise.
func (s *SGLang) health(e *Engine, w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	first := !s.started
	s.started = true
	s.mu.Unlock()
	if first || e.Phase() != PhaseReady {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// serverInfo answers /get_server_info.
func (s *SGLang) serverInfo(e *Engine, w http.ResponseWriter, r *http.Request) {
	released := e.Phase() == PhaseParked
	WriteJSON(w, http.StatusOK, map[string]any{
		"model_path": s.opts.ModelPath, "served_model_name": e.ServedName(), "context_length": s.opts.ContextLength,
		"max_running_requests": e.Config().MaxRunning, "enable_memory_saver": s.opts.MemorySaver,
		"enable_weights_cpu_backup": s.opts.WeightsCPUBackup, "enable_metrics": s.opts.Metrics,
		"tokenizer_worker_num": s.opts.TokenizerWorkers, "plugins": s.opts.Plugins,
		"internal_states": []map[string]any{{"memory_released": released}},
		"version":         s.opts.Version,
	})
}

// flushCache answers /flush_cache: refused while requests run or wait.
func (s *SGLang) flushCache(e *Engine, w http.ResponseWriter, r *http.Request) {
	if running, waiting := e.slots.counts(); running > 0 || waiting > 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, "Cache not flushed. Please check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
		return
	}
	s.mu.Lock()
	s.flushes++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
}

// abort answers POST /abort_request {"rid": "...", "abort_all": bool}.
func (s *SGLang) abort(e *Engine, w http.ResponseWriter, r *http.Request) {
	var body struct {
		Rid      *string `json:"rid"`
		AbortAll bool    `json:"abort_all"`
	}
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(data, &body); err != nil {
		s.WriteError(w, KindInvalidJSON, "invalid JSON body: "+err.Error())
		return
	}
	n := 0
	switch {
	case body.AbortAll:
		n = e.AbortAll()
	case body.Rid != nil && *body.Rid != "":
		n = e.Abort(*body.Rid)
	}
	if n > 0 {
		e.Logf(LevelInfo, "Abort request: %d request(s) aborted", n)
	}
	w.WriteHeader(http.StatusOK)
}

// memoryTags reads {"tags": [...]}; none means both.
func (s *SGLang) memoryTags(r *http.Request) ([]string, error) {
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var body struct {
		Tags []string `json:"tags"`
	}
	if len(strings.TrimSpace(string(data))) > 0 {
		if err := json.Unmarshal(data, &body); err != nil {
			return nil, err
		}
	}
	return body.Tags, nil
}

// release answers /release_memory_occupation.
func (s *SGLang) release(e *Engine, w http.ResponseWriter, r *http.Request) {
	tags, err := s.memoryTags(r)
	if err != nil {
		s.WriteError(w, KindInvalidJSON, "invalid JSON body: "+err.Error())
		return
	}
	if !s.opts.MemorySaver {
		e.Logf(LevelWarn, "release_memory_occupation is a no-op: the server runs without --enable-memory-saver")
		WriteJSON(w, http.StatusOK, nil)
		return
	}
	if running, waiting := e.slots.counts(); running > 0 || waiting > 0 {
		e.Logf(LevelError, "release_memory_occupation should be called only when no ongoing request")
		s.WriteError(w, KindInvalidRequest, "release_memory_occupation should be called only when no ongoing request")
		return
	}
	if err := e.Park(1, tags...); err != nil {
		s.WriteError(w, KindEngineFailure, err.Error())
		return
	}
	s.mu.Lock()
	s.releases++
	if !s.opts.WeightsCPUBackup && (len(tags) == 0 || containsTag(tags, TagWeights)) {
		s.dropped = true
	}
	s.mu.Unlock()
	WriteJSON(w, http.StatusOK, nil)
}

// resume answers /resume_memory_occupation.
func (s *SGLang) resume(e *Engine, w http.ResponseWriter, r *http.Request) {
	tags, err := s.memoryTags(r)
	if err != nil {
		s.WriteError(w, KindInvalidJSON, "invalid JSON body: "+err.Error())
		return
	}
	// IMPORTANT: decide staleness before the wake: the wake releases the
	// requests that waited, and they must already see the stale weights.
	s.mu.Lock()
	wasDropped, wasStale := s.dropped, s.stale
	if s.dropped && (len(tags) == 0 || containsTag(tags, TagWeights)) {
		s.stale, s.dropped = true, false
	}
	s.mu.Unlock()
	if err := e.Wake(tags...); err != nil {
		s.mu.Lock()
		s.dropped, s.stale = wasDropped, wasStale
		s.mu.Unlock()
		s.WriteError(w, KindEngineFailure, err.Error())
		return
	}
	WriteJSON(w, http.StatusOK, nil)
}

// updateWeights answers POST /update_weights_from_disk.
func (s *SGLang) updateWeights(e *Engine, w http.ResponseWriter, r *http.Request) {
	var body struct {
		ModelPath string `json:"model_path"`
	}
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if json.Unmarshal(data, &body) != nil || body.ModelPath == "" {
		WriteJSON(w, http.StatusBadRequest, map[string]any{"success": false, "message": "model_path is required"})
		return
	}
	e.parkMu.Lock()
	asleep := e.parked[TagWeights]
	e.parkMu.Unlock()
	if asleep {
		WriteJSON(w, http.StatusBadRequest, map[string]any{"success": false, "message": "the weights' memory is released: resume it first"})
		return
	}
	s.mu.Lock()
	s.stale, s.dropped = false, false
	s.mu.Unlock()
	e.Logf(LevelInfo, "Update engine weights online from disk begin. model_path=%s", body.ModelPath)
	WriteJSON(w, http.StatusOK, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}

// decide answers a decision request with deterministic probabilities.
func (s *SGLang) decide(e *Engine, w http.ResponseWriter, r *http.Request) {
	data, _ := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes))
	var req decisions.Request
	if err := json.Unmarshal(data, &req); err != nil {
		s.WriteError(w, KindInvalidJSON, "invalid JSON body: "+err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		s.WriteError(w, KindInvalidRequest, err.Error())
		return
	}
	if err := e.slots.acquire(r.Context()); err != nil {
		return // the client went away while waiting
	}
	defer e.slots.release()
	resp := decisions.Response{ID: "decision-" + req.Rid, Object: decisions.Object, Created: time.Now().Unix(), Model: req.Model,
		Usage: decisions.Usage{PromptTokens: int64(len(req.State)/4 + 1), CompletionTokens: int64(len(req.Questions)), TotalTokens: int64(len(req.State)/4 + 1 + len(req.Questions))}}
	if req.Rid == "" {
		resp.ID = "decision-" + NewRequestID()
	}
	for _, q := range req.Questions {
		labels := q.Labels()
		probs := map[string]float64{}
		var sum float64
		for _, l := range labels {
			h := fnv.New64a()
			fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", e.ServedName(), req.State, q.Text, l)
			p := float64(h.Sum64()%1000) + 1
			probs[l] = p
			sum += p
		}
		for l := range probs {
			probs[l] /= sum
		}
		a := decisions.Answer{ID: q.ID, Type: q.Type, Probabilities: probs}
		if q.Type == decisions.TypeScore {
			exp := decisions.Expected(q, probs)
			a.Expected = &exp
		}
		resp.Answers = append(resp.Answers, a)
	}
	WriteJSON(w, http.StatusOK, resp)
}

// Stale reports whether resumed weights were not reloaded.
func (s *SGLang) Stale() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stale
}

// Flushes counts successful /flush_cache calls.
func (s *SGLang) Flushes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushes
}

func containsTag(tags []string, t string) bool {
	for _, x := range tags {
		if x == t {
			return true
		}
	}
	return false
}

// Middleware guards everything but /health*, /ready* and /metrics* with
// the key, as decide_request_auth (python/sglang/srt/utils/auth.py) does.
func (s *SGLang) Middleware(e *Engine, next http.Handler) http.Handler {
	public := func(r *http.Request) bool {
		p := r.URL.Path
		if r.Method == http.MethodOptions {
			return true
		}
		for _, open := range SGLangFacts.OpenPrefixes {
			if strings.HasPrefix(p, open.Value) {
				return true
			}
		}
		return false
	}
	deny := func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
	}
	return APIKeyMiddleware(e.Config().APIKey, public, nil, deny)(next)
}

// AcceptWhileLoading is false: the scheduler loads the model before the
// HTTP server runs.
func (s *SGLang) AcceptWhileLoading() bool { return false }

// SignalExitCode is 0.
func (s *SGLang) SignalExitCode() int { return 0 }

// FormatLog writes SGLang's "[2006-01-02 15:04:05] message".
func (s *SGLang) FormatLog(t time.Time, level Level, msg string) string {
	if level != LevelInfo {
		return fmt.Sprintf("[%s] %s: %s", t.Format("2006-01-02 15:04:05"), level, msg)
	}
	return fmt.Sprintf("[%s] %s", t.Format("2006-01-02 15:04:05"), msg)
}

// WriteError writes SGLang's ErrorResponse {"object":"error","message","type","param","code"};
// an unknown path is FastAPI's {"detail":"Not Found"}.
func (s *SGLang) WriteError(w http.ResponseWriter, kind ErrorKind, msg string) {
	status, typ, ok := fastAPIError(w, kind)
	if !ok {
		return
	}
	WriteJSON(w, status, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": status})
}

// PrepareChat takes the request ID from the body's "rid" (a string, or the
// first of a list). SGLang serves one model and does not check the name.
func (s *SGLang) PrepareChat(e *Engine, r *http.Request, req *ChatRequest) error {
	if raw, ok := req.Raw["rid"]; ok {
		var one string
		var many []string
		switch {
		case json.Unmarshal(raw, &one) == nil:
			req.ID = one
		case json.Unmarshal(raw, &many) == nil && len(many) > 0:
			req.ID = many[0]
		case string(raw) == "null":
		default:
			return &APIError{Kind: KindInvalidRequest, Message: "rid must be a string or a list of strings"}
		}
	}
	req.ResponseModel = req.Model
	return nil
}

// ChatResponse is an OpenAI chat.completion (garbage after a resume
// without a reload).
func (s *SGLang) ChatResponse(res *ChatResult) any { return staleResponse(s.Stale(), res) }

// ChatStream is an OpenAI stream with the role chunk and, on request, the
// usage chunk.
func (s *SGLang) ChatStream(req *ChatRequest, meta ChatMeta) ChatStream {
	return staleStream(s.Stale(), req, meta)
}

// SGLangMetrics are SGLang's metrics (--enable-metrics) for the served
// model.
func SGLangMetrics(served string, st Stats) []Metric {
	labels := []Label{{Name: "model_name", Value: served}, {Name: "engine_type", Value: "unified"}, {Name: "tp_rank", Value: "0"}, {Name: "pp_rank", Value: "0"}}
	usage := 0.0
	if st.MaxRunning > 0 {
		usage = float64(st.Running) / float64(st.MaxRunning)
	}
	return []Metric{
		{Name: SGLangFacts.Running.Value, Type: "gauge", Help: "The number of running requests.", Labels: labels, Value: float64(st.Running)},
		{Name: SGLangFacts.Waiting.Value, Type: "gauge", Help: "The number of requests in the waiting queue.", Labels: labels, Value: float64(st.Waiting)},
		{Name: SGLangFacts.KVUsage.Value, Type: "gauge", Help: "The token usage.", Labels: labels, Value: usage},
		{Name: "sglang:num_used_tokens", Type: "gauge", Help: "The number of used tokens.", Labels: labels, Value: float64(st.Running * 16)},
		{Name: "sglang:gen_throughput", Type: "gauge", Help: "The generation throughput (token/s).", Labels: labels, Value: 0},
		{Name: "sglang:cache_hit_rate", Type: "gauge", Help: "The prefix cache hit rate.", Labels: labels, Value: 0},
		{Name: "sglang:prompt_tokens_total", Type: "counter", Help: "Number of prefill tokens processed.", Labels: labels, Value: float64(st.PromptTokens)},
		{Name: "sglang:generation_tokens_total", Type: "counter", Help: "Number of generation tokens processed.", Labels: labels, Value: float64(st.GenerationTokens)},
	}
}
