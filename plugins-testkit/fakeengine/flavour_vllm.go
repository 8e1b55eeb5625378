// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultVLLMVersion is what the vLLM flavour reports when told nothing.
const DefaultVLLMVersion = "0.32.0"

// VLLMUDSSince is the first release the fake vLLM takes --uds in (serving
// on a Unix socket instead of its port): FactVLLMUDS. It refuses the
// option in older ones, as an argparse that lacks it does.
var VLLMUDSSince = []int{0, 10, 2}

// VLLMOptions are what a vLLM launch decides with its argv and environment.
type VLLMOptions struct {
	// Version is reported on GET /version (DefaultVLLMVersion when empty).
	Version string
	// DevMode is VLLM_SERVER_DEV_MODE=1: the development routes exist
	// (/sleep, /wake_up, /is_sleeping, /reset_prefix_cache,
	// /collective_rpc, /server_info); without it they are 404.
	DevMode bool
	// SleepMode is --enable-sleep-mode: without it /sleep fails (500).
	SleepMode bool
	// MaxModelLen is max_model_len on the model card.
	MaxModelLen int
	// Root is the model path (--model), "root" on the model card.
	Root string
}

// VLLM is the vLLM flavour (the OpenAI server of vLLM 0.29 to 0.32):
//
//	GET  /health               200, empty body (also while asleep)
//	GET  /version              {"version": "..."}
//	GET  /ping                 200 (SageMaker)
//	GET  /v1/models            owned_by "vllm", root, parent, max_model_len, permission
//	POST /v1/chat/completions  the request ID is the X-Request-Id header
//	POST /v1/completions       text completions (completions.go), the same request ID
//	POST /v1/embeddings        embeddings (embeddings.go), id "embd-…"
//	POST /v1/rerank            rerank (rerank.go), id "rerank-…", each result's document
//	                           (vLLM's /rerank is not served: it lies outside the guarded
//	                           prefixes, which VLLMFacts does not list as guarded)
//	GET  /metrics              vllm:num_requests_running/_waiting, vllm:kv_cache_usage_perc, counters
//	dev mode only:
//	POST /sleep?level=1|2[&mode=abort|wait|keep]   (500 without --enable-sleep-mode)
//	POST /wake_up[?tags=weights][&tags=kv_cache]
//	GET  /is_sleeping          {"is_sleeping": bool}
//	POST /reset_prefix_cache
//	POST /collective_rpc       {"method": "reload_weights"}
//	GET  /server_info
//
// The port is bound at once but refuses connections until the model is
// loaded. Only paths under /v1, /v2, /inference and /cohere need the key
// (401 {"error":"Unauthorized"}). Sleeping frees the GPU memory (level 1:
// the weights go to host RAM; level 2: they are dropped); a request sent
// while asleep waits until the engine wakes. After a level-2 sleep the
// weights come back from /wake_up as garbage until /collective_rpc
// reload_weights reloads them, so a wake without the reload answers
// differently (and fails a wake check).
type VLLM struct {
	opts VLLMOptions

	mu           sync.Mutex
	dropped      bool // level 2 dropped the weights' contents
	stale        bool // weights woken without a reload: answers are garbage
	prefixResets int
	reloads      int
	// offloaded is the weights kept in host RAM at level 1 (hostCopy
	// holds them for real with SleepCosts.HoldHost).
	offloaded int64
	hostCopy  []byte
}

var _ Flavour = (*VLLM)(nil)

func init() {
	RegisterFlavour("vllm", func() Flavour { return NewVLLM(VLLMOptions{DevMode: true, SleepMode: true}) })
}

// NewVLLM returns a vLLM flavour.
func NewVLLM(o VLLMOptions) *VLLM {
	if o.Version == "" {
		o.Version = DefaultVLLMVersion
	}
	return &VLLM{opts: o}
}

// Options returns the flavour's options.
func (v *VLLM) Options() VLLMOptions { return v.opts }

// Name is "vllm".
func (v *VLLM) Name() string { return "vllm" }

// Routes lists vLLM's routes.
func (v *VLLM) Routes(e *Engine) []Route {
	routes := []Route{
		{Pattern: "GET /health", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })},
		{Pattern: "GET /ping", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })},
		{Pattern: "GET /version", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, http.StatusOK, map[string]string{"version": v.opts.Version})
		})},
		{Pattern: "GET /v1/models", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { v.models(e, w) })},
		{Pattern: "POST /v1/chat/completions", Handler: e.ChatHandler()},
		{Pattern: "POST /v1/completions", Handler: e.CompletionsHandler()},
		{Pattern: "POST /v1/embeddings", Handler: e.EmbeddingsHandler(true)},
		{Pattern: "POST /v1/rerank", Handler: e.RerankHandler(true)},
		{Pattern: "GET /metrics", Handler: MetricsHandler(e, func(s Stats) []Metric { return VLLMMetrics(e.ServedName(), s) })},
		{Pattern: "GET /fake/stats", Handler: e.StatsHandler()},
	}
	routes = append(routes, vllmAPIRoutes(e)...)
	if v.opts.DevMode {
		routes = append(routes,
			Route{Pattern: "POST /sleep", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { v.sleep(e, w, r) })},
			Route{Pattern: "POST /wake_up", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { v.wakeUp(e, w, r) })},
			Route{Pattern: "GET /is_sleeping", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				WriteJSON(w, http.StatusOK, map[string]bool{"is_sleeping": e.Phase() == PhaseParked})
			})},
			Route{Pattern: "POST /reset_prefix_cache", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				v.mu.Lock()
				v.prefixResets++
				v.mu.Unlock()
				w.WriteHeader(http.StatusOK)
			})},
			Route{Pattern: "POST /collective_rpc", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { v.collectiveRPC(e, w, r) })},
			Route{Pattern: "GET /server_info", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				WriteJSON(w, http.StatusOK, map[string]any{"vllm_config": fmt.Sprintf("model=%s, enable_sleep_mode=%v", v.opts.Root, v.opts.SleepMode)})
			})},
		)
	}
	return routes
}

// models answers GET /v1/models with vLLM's model card.
func (v *VLLM) models(e *Engine, w http.ResponseWriter) {
	root := v.opts.Root
	if root == "" {
		root = e.ServedName()
	}
	card := map[string]any{
		"id": e.ServedName(), "object": "model", "created": e.Created().Unix(), "owned_by": "vllm",
		"root": root, "parent": nil, "max_model_len": v.opts.MaxModelLen,
		"permission": []map[string]any{{
			"id": "modelperm-" + e.ServedName(), "object": "model_permission", "created": e.Created().Unix(),
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
			"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false,
		}},
	}
	WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{card}})
}

// sleep answers POST /sleep?level=N[&mode=...].
func (v *VLLM) sleep(e *Engine, w http.ResponseWriter, r *http.Request) {
	if !v.opts.SleepMode {
		e.Logf(LevelError, "AssertionError: Sleep mode is not enabled in the model config")
		v.WriteError(w, KindEngineFailure, "Sleep mode is not enabled in the model config")
		return
	}
	q := r.URL.Query()
	level := 1
	if s := q.Get("level"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || (n != 1 && n != 2) {
			v.WriteError(w, KindInvalidRequest, "level must be 1 or 2")
			return
		}
		level = n
	}
	switch mode := q.Get("mode"); mode {
	case "", "abort":
		if n := e.AbortAll(); n > 0 {
			e.Logf(LevelInfo, "aborted %d requests before sleeping", n)
		}
	case "wait":
		if !v.waitIdle(e, r) {
			return // the client went away
		}
	case "keep":
	default:
		v.WriteError(w, KindInvalidRequest, "mode must be abort, wait or keep")
		return
	}
	if err := e.Park(level); err != nil {
		v.WriteError(w, KindEngineFailure, err.Error())
		return
	}
	if level == 2 {
		v.mu.Lock()
		v.dropped = true
		v.mu.Unlock()
	} else {
		v.offload(e)
	}
	e.Logf(LevelInfo, "It took %.6f seconds to fall asleep.", 0.0)
	w.WriteHeader(http.StatusOK)
}

// waitIdle waits until nothing runs or waits (sleep mode=wait).
func (v *VLLM) waitIdle(e *Engine, r *http.Request) bool {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if running, waiting := e.slots.counts(); running == 0 && waiting == 0 {
			return true
		}
		select {
		case <-r.Context().Done():
			return false
		case <-t.C:
		}
	}
}

// wakeUp answers POST /wake_up[?tags=...].
func (v *VLLM) wakeUp(e *Engine, w http.ResponseWriter, r *http.Request) {
	tags := r.URL.Query()["tags"]
	wokeWeights := len(tags) == 0
	for _, t := range tags {
		wokeWeights = wokeWeights || t == TagWeights
	}
	// IMPORTANT: the weights turn stale before the wake lets requests that
	// waited while asleep run, or the first of them answers as if the
	// contents had been kept.
	v.mu.Lock()
	stale, dropped := v.stale, v.dropped
	if wokeWeights && v.dropped {
		// Level 2 kept no copy: the memory is back, its contents are not.
		v.stale, v.dropped = true, false
	}
	v.mu.Unlock()
	if wokeWeights {
		// Level 1 kept them in host RAM: they are copied back.
		v.restore(e)
	}
	if err := e.Wake(tags...); err != nil {
		v.mu.Lock()
		v.stale, v.dropped = stale, dropped
		v.mu.Unlock()
		v.WriteError(w, KindEngineFailure, err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

// collectiveRPC answers POST /collective_rpc; only reload_weights is known.
func (v *VLLM) collectiveRPC(e *Engine, w http.ResponseWriter, r *http.Request) {
	var body struct {
		Method string `json:"method"`
	}
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if json.Unmarshal(data, &body) != nil || body.Method == "" {
		v.WriteError(w, KindInvalidRequest, "body must be JSON with a method")
		return
	}
	if body.Method != "reload_weights" {
		v.WriteError(w, KindEngineFailure, fmt.Sprintf("AttributeError: worker has no method %q", body.Method))
		return
	}
	// The weights are read from disk again.
	time.Sleep(moveTime(e.cfg.Sim.Weights, e.cfg.Sleep.ReloadRate))
	// A group's head reloads on every rank (group.go's "reload"), as
	// vLLM's collective_rpc runs on every worker of the executor.
	e.parkMu.Lock()
	var err error
	if e.parked[TagWeights] {
		err = errors.New("cannot reload weights while they sleep: wake_up?tags=weights first")
	} else {
		err = e.groupCall("reload", "reloaded")
	}
	e.parkMu.Unlock()
	if err != nil {
		v.WriteError(w, KindEngineFailure, err.Error())
		return
	}
	v.mu.Lock()
	v.stale, v.dropped = false, false
	v.reloads++
	v.mu.Unlock()
	e.Logf(LevelInfo, "reloaded the weights of %s", v.opts.Root)
	WriteJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
}

// Stale reports whether the weights were woken without a reload (answers
// are garbage).
func (v *VLLM) Stale() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.stale
}

// PrefixResets counts POST /reset_prefix_cache.
func (v *VLLM) PrefixResets() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.prefixResets
}

// Middleware guards /v1, /v2, /inference and /cohere with the key, as
// vLLM's AuthenticationMiddleware does; everything else is open.
func (v *VLLM) Middleware(e *Engine, next http.Handler) http.Handler {
	public := func(r *http.Request) bool {
		if r.Method == http.MethodOptions {
			return true
		}
		for _, p := range Values(VLLMFacts.GuardedPrefixes) {
			if r.URL.Path == p || strings.HasPrefix(r.URL.Path, p+"/") {
				return false
			}
		}
		return true
	}
	deny := func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
	}
	return APIKeyMiddleware(e.Config().APIKey, public, nil, deny)(next)
}

// AcceptWhileLoading is false: vLLM binds its port before loading and
// serves HTTP only after.
func (v *VLLM) AcceptWhileLoading() bool { return false }

// SignalExitCode is 0.
func (v *VLLM) SignalExitCode() int { return 0 }

// FormatLog writes vLLM's "INFO 07-01 12:00:00 [api_server.py:1] message".
func (v *VLLM) FormatLog(t time.Time, level Level, msg string) string {
	return fmt.Sprintf("%s %s [api_server.py:1] %s", level, t.Format("01-02 15:04:05"), msg)
}

// WriteError writes vLLM's ErrorResponse {"error":{"message","type","param","code"}};
// an unknown path is FastAPI's {"detail":"Not Found"}.
func (v *VLLM) WriteError(w http.ResponseWriter, kind ErrorKind, msg string) {
	status, typ, ok := fastAPIError(w, kind)
	if !ok {
		return
	}
	WriteJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

// fastAPIError writes the answers vLLM and SGLang (both FastAPI servers)
// give alike: FastAPI's {"detail":"Not Found"} for an unknown path and the
// API key middleware's 401. For the other kinds it writes nothing and
// returns the status and error type of the engine's own error body; ok is
// false when it answered.
func fastAPIError(w http.ResponseWriter, kind ErrorKind) (status int, typ string, ok bool) {
	status, typ = http.StatusBadRequest, "BadRequestError"
	switch kind {
	case KindRouteNotFound:
		WriteJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return 0, "", false
	case KindUnauthorized:
		WriteJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
		return 0, "", false
	case KindModelNotFound:
		status, typ = http.StatusNotFound, "NotFoundError"
	case KindLoading:
		status, typ = http.StatusServiceUnavailable, "ServiceUnavailableError"
	case KindEngineFailure:
		status, typ = http.StatusInternalServerError, "InternalServerError"
	case KindNotSupported:
		status, typ = http.StatusNotImplemented, "NotImplementedError"
	}
	return status, typ, true
}

// PrepareChat requires the served name and takes the request ID from
// X-Request-Id.
func (v *VLLM) PrepareChat(e *Engine, r *http.Request, req *ChatRequest) error {
	if req.Model != e.ServedName() {
		return &APIError{Kind: KindModelNotFound, Message: fmt.Sprintf("The model `%s` does not exist.", req.Model)}
	}
	req.ID = r.Header.Get("X-Request-Id")
	req.ResponseModel = req.Model
	return nil
}

// ChatResponse is an OpenAI chat.completion (garbage after an unreloaded
// level-2 wake).
func (v *VLLM) ChatResponse(res *ChatResult) any { return staleResponse(v.Stale(), res) }

// ChatStream is an OpenAI stream with the role chunk and, on request, the
// usage chunk.
func (v *VLLM) ChatStream(req *ChatRequest, meta ChatMeta) ChatStream {
	return staleStream(v.Stale(), req, meta)
}

// staleResponse is an OpenAI chat.completion, garbage when the weights
// are stale (vLLM and SGLang woken without a reload).
func staleResponse(stale bool, res *ChatResult) any {
	if stale {
		c := *res
		c.Text = garbage(res.Text)
		res = &c
	}
	return OpenAI{}.ChatResponse(res)
}

// staleStream is an OpenAI stream with the role chunk and, on request, the
// usage chunk, garbage when the weights are stale.
func staleStream(stale bool, req *ChatRequest, meta ChatMeta) ChatStream {
	s := &OpenAIStream{Meta: meta, RoleChunk: true, UsageChunk: req.IncludeUsage()}
	if stale {
		return garbageStream{s}
	}
	return s
}

// garbage is what uninitialised weights answer: the same length, no sense.
func garbage(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c != ' ' {
			b[i] = '!'
		}
	}
	return string(b)
}

// garbageStream streams garbage.
type garbageStream struct{ *OpenAIStream }

// Token sends one garbled piece.
func (g garbageStream) Token(text string) []byte { return g.OpenAIStream.Token(garbage(text)) }

// VLLMMetrics are vLLM's metrics for the served model (labels model_name
// and engine).
func VLLMMetrics(served string, s Stats) []Metric {
	labels := []Label{{Name: "engine", Value: "0"}, {Name: "model_name", Value: served}}
	usage := 0.0
	if s.MaxRunning > 0 {
		usage = float64(s.Running) / float64(s.MaxRunning)
	}
	return []Metric{
		{Name: VLLMFacts.Running.Value, Type: "gauge", Help: "Number of requests in model execution batches.", Labels: labels, Value: float64(s.Running)},
		{Name: VLLMFacts.Waiting.Value, Type: "gauge", Help: "Number of requests waiting to be processed.", Labels: labels, Value: float64(s.Waiting)},
		{Name: VLLMFacts.KVUsage.Value, Type: "gauge", Help: "KV-cache usage. 1 means 100 percent usage.", Labels: labels, Value: usage},
		{Name: "vllm:num_preemptions_total", Type: "counter", Help: "Cumulative number of preemption from the engine.", Labels: labels, Value: 0},
		{Name: "vllm:prompt_tokens_total", Type: "counter", Help: "Number of prefill tokens processed.", Labels: labels, Value: float64(s.PromptTokens)},
		{Name: "vllm:generation_tokens_total", Type: "counter", Help: "Number of generation tokens processed.", Labels: labels, Value: float64(s.GenerationTokens)},
		{Name: "vllm:prefix_cache_queries_total", Type: "counter", Help: "Prefix cache queries, in terms of number of queried tokens.", Labels: labels, Value: float64(s.PromptTokens)},
		{Name: "vllm:prefix_cache_hits_total", Type: "counter", Help: "Prefix cache hits, in terms of number of cached tokens.", Labels: labels, Value: 0},
		{Name: "vllm:request_success_total", Type: "counter", Help: "Count of successfully processed requests.",
			Labels: append([]Label{{Name: "finished_reason", Value: "stop"}}, labels...), Value: float64(s.Completed)},
	}
}

// SleepCosts are what vLLM's sleep levels cost and keep, by the size of the
// simulated weights (Sim.Weights): level 1 offloads the weights to host
// RAM (pinned CPU memory: the process's resident memory grows by their
// size) and a wake copies them back over PCIe; level 2 discards them and
// reload_weights reads them from disk again (vLLM's sleep mode docs;
// reference/engines.md §1.7 note 3).
type SleepCosts struct {
	// WakeRate is how many bytes of weights per second a wake from level 1
	// copies back (0: at once).
	WakeRate int64
	// ReloadRate is how many bytes of weights per second reload_weights
	// reads after level 2 (0: at once).
	ReloadRate int64
	// HoldHost holds the weights' size in real host RAM while asleep at
	// level 1; otherwise the offload is only counted (Offloaded), so that a
	// demo's 8 GiB model does not take 8 GiB of the laptop's RAM.
	HoldHost bool
}

// moveTime is the time to move n bytes at rate bytes per second.
func moveTime(n, rate int64) time.Duration {
	if n <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(float64(n) / float64(rate) * float64(time.Second))
}

// offload keeps the weights in host RAM at level 1.
func (v *VLLM) offload(e *Engine) {
	n := e.cfg.Sim.Weights
	v.mu.Lock()
	defer v.mu.Unlock()
	v.offloaded = n
	if e.cfg.Sleep.HoldHost && n > 0 {
		v.hostCopy = make([]byte, n)
		for i := int64(0); i < n; i += 4096 {
			v.hostCopy[i] = 1
		}
	}
	e.Logf(LevelInfo, "offloaded %s of weights to CPU memory", FormatBytes(n))
}

// restore copies the offloaded weights back (a wake after level 1), taking
// the time the copy takes.
func (v *VLLM) restore(e *Engine) {
	v.mu.Lock()
	n := v.offloaded
	v.mu.Unlock()
	if n == 0 {
		return
	}
	time.Sleep(moveTime(n, e.cfg.Sleep.WakeRate))
	v.mu.Lock()
	v.offloaded, v.hostCopy = 0, nil
	v.mu.Unlock()
}

// Offloaded is the weights the engine keeps in host RAM, asleep at level 1
// (0 otherwise).
func (v *VLLM) Offloaded() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.offloaded
}
