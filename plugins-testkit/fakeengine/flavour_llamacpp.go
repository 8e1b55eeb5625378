// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/capyctl/capyctl/sdk/decisions"
)

// LlamaCppBuild is the build the flavour reproduces (llama.cpp b4748, as
// observed in ../shared/reference/llamaserver-observed.md).
const LlamaCppBuild = "b4748-c392e5094"

// LlamaCppOptions are the llama-server settings the flavour honours, as
// its command line gives them.
type LlamaCppOptions struct {
	// ModelPath is -m as given: the model's id in /v1/models when no alias
	// is set.
	ModelPath string
	// Alias is --alias.
	Alias string
	// CtxSize is -c, the context of all slots together.
	CtxSize int
	// Parallel is -np, the number of slots.
	Parallel int
	// Metrics enables GET /metrics (--metrics); 501 otherwise.
	Metrics bool
	// Slots enables GET /slots (--slots); 501 otherwise.
	Slots bool
	// Embeddings enables POST /v1/embeddings (--embeddings); 501
	// otherwise.
	Embeddings bool
	// Reranking enables POST /v1/rerank and /rerank (--reranking); 501
	// otherwise.
	Reranking bool
	// Props enables POST /props (--props).
	Props bool
	// NoContextShift refuses prompts longer than a slot's context
	// (--no-context-shift) instead of truncating them.
	NoContextShift bool
	// Meta is what /v1/models shows under "meta" (from the GGUF header).
	Meta LlamaCppMeta
	// ChatTemplate is what /props shows.
	ChatTemplate string
	// TokenRate is the engine's token rate, for the timings answers carry
	// (0: 0.3 ms a token, as stories260K ran).
	TokenRate float64
}

// LlamaCppMeta is the "meta" object of llama-server's model card.
type LlamaCppMeta struct {
	VocabType int    `json:"vocab_type"`
	NVocab    int    `json:"n_vocab"`
	NCtxTrain int    `json:"n_ctx_train"`
	NEmbd     int    `json:"n_embd"`
	NParams   uint64 `json:"n_params"`
	Size      uint64 `json:"size"`
}

// LlamaCpp is llama.cpp's llama-server as build b4748 behaved on the wire:
//
//	GET  /health, /v1/health        200 {"status":"ok"}
//	GET  /models, /v1/models        the model card (id: alias or -m path, owned_by llamacpp, meta)
//	GET  /props                     slots and context; POST /props needs --props
//	GET  /slots[?fail_on_no_slot=1] one object per slot (needs --slots, else 501)
//	GET  /metrics                   llamacpp:* without labels (needs --metrics, else 501)
//	POST /v1/chat/completions, /chat/completions
//	POST /v1/completions            text completions (completions.go)
//	POST /v1/embeddings             embeddings, no id (needs --embeddings, else 501)
//	POST /v1/rerank, /rerank        rerank, no id (needs --reranking, else 501)
//	POST /v1/systemone              decision requests (decision models)
//
// The port is bound before the model loads and every route answers 503
// {"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}
// until it is loaded. Any model name is accepted; the answer's model is the
// request's, else the alias, else "gpt-3.5-turbo". Streams send no role
// chunk; the last chunk has an empty delta, the finish reason, usage and
// timings, and "data: [DONE]" follows. Every client error is a 500
// server_error (bad JSON included). /health, /models and /v1/models need
// no key; the others take "Authorization: Bearer" or "X-Api-Key". SIGTERM
// ends the process with status 134.
type LlamaCpp struct {
	opts LlamaCppOptions
}

var _ Flavour = (*LlamaCpp)(nil)

func init() {
	RegisterFlavour("llamacpp", func() Flavour { return NewLlamaCpp(LlamaCppOptions{}) })
}

// NewLlamaCpp returns the flavour.
func NewLlamaCpp(o LlamaCppOptions) *LlamaCpp {
	if o.Parallel <= 0 {
		o.Parallel = 1
	}
	if o.CtxSize <= 0 {
		o.CtxSize = 4096
	}
	return &LlamaCpp{opts: o}
}

// Options returns the flavour's settings.
func (l *LlamaCpp) Options() LlamaCppOptions { return l.opts }

// SlotContext is each slot's context: -c divided among the -np slots.
func (l *LlamaCpp) SlotContext() int { return l.opts.CtxSize / l.opts.Parallel }

// ClosesAfterStream is true: build b4748 closes the connection after every
// streamed answer although the answer advertised keep-alive.
func (l *LlamaCpp) ClosesAfterStream() bool { return true }

// NonStreamedHangupPoll is one second (HTTP_POLLING_SECONDS): b4748 checks
// a non-streamed client only when a second passes without any result.
func (l *LlamaCpp) NonStreamedHangupPoll() time.Duration { return time.Second }

// Name is "llamacpp".
func (l *LlamaCpp) Name() string { return "llamacpp" }

// Routes lists llama-server's routes.
func (l *LlamaCpp) Routes(e *Engine) []Route {
	h := func(f func(*Engine, http.ResponseWriter, *http.Request)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(e, w, r) })
	}
	health := h(func(e *Engine, w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	models := h(l.models)
	chat := e.ChatHandler()
	return []Route{
		{Pattern: "GET /health", Handler: health},
		{Pattern: "GET /v1/health", Handler: health},
		{Pattern: "GET /models", Handler: models},
		{Pattern: "GET /v1/models", Handler: models},
		{Pattern: "GET /props", Handler: h(l.props)},
		{Pattern: "POST /props", Handler: h(l.setProps)},
		{Pattern: "GET /slots", Handler: h(l.slots)},
		{Pattern: "GET /metrics", Handler: h(l.metrics)},
		{Pattern: "POST /v1/chat/completions", Handler: chat},
		{Pattern: "POST /chat/completions", Handler: chat},
		{Pattern: "POST /v1/completions", Handler: e.CompletionsHandler()},
		{Pattern: "POST /v1/embeddings", Handler: h(l.embeddings)},
		{Pattern: "POST /v1/rerank", Handler: h(l.rerank)},
		{Pattern: "POST /rerank", Handler: h(l.rerank)},
		{Pattern: "POST " + decisions.Path, Handler: h(l.decide)},
		{Pattern: "GET /fake/stats", Handler: e.StatsHandler()},
	}
}

// llamaPublic are the paths llama-server serves without a key: the
// fake's own facts (LlamaCppFacts.OpenRoutes).
func llamaPublic(path string) bool {
	return slices.Contains(Values(LlamaCppFacts.OpenRoutes), path)
}

// Middleware answers 503 on every route while loading (before the key
// check, as llama-server's state middleware runs first), then checks the
// key on the non-public routes.
func (l *LlamaCpp) Middleware(e *Engine, next http.Handler) http.Handler {
	deny := func(w http.ResponseWriter, r *http.Request) {
		l.WriteError(w, KindUnauthorized, "Invalid API Key")
	}
	creds := func(r *http.Request) []string { return []string{BearerToken(r), r.Header.Get("X-Api-Key")} }
	guarded := APIKeyMiddleware(e.Config().APIKey, func(r *http.Request) bool { return llamaPublic(r.URL.Path) }, creds, deny)(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "llama.cpp")
		if e.Phase() == PhaseLoading {
			if r.URL.Path == "/" {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, `<html><head><meta http-equiv="refresh" content="5"></head><body>Loading model</body></html>`)
				return
			}
			l.WriteError(w, KindLoading, "Loading model")
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// AcceptWhileLoading is true: llama-server binds and serves before the
// model loads.
func (l *LlamaCpp) AcceptWhileLoading() bool { return true }

// SignalExitCode is 134: llama-server aborts on its way out of a SIGTERM.
func (l *LlamaCpp) SignalExitCode() int { return 134 }

// FormatLog writes llama-server's log lines; the shutdown lines are the
// ones b4748 printed.
func (l *LlamaCpp) FormatLog(t time.Time, level Level, msg string) string {
	switch msg {
	case "shutting down":
		return "srv    operator(): cleaning up before exit..."
	case "stopped":
		return "terminate called without an active exception"
	}
	prefix := "main: "
	switch level {
	case LevelWarn:
		prefix = "W main: "
	case LevelError:
		prefix = "E main: "
	}
	return prefix + msg
}

// kindExceedsContext is a prompt longer than a slot's context with
// --no-context-shift: llama-server's one 400.
const kindExceedsContext ErrorKind = 100

// llamaError is llama-server's error envelope, code first.
type llamaError struct {
	Error llamaErrorBody `json:"error"`
}

type llamaErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Type    string `json:"type"`
}

// WriteError writes llama-server's envelope. Build b4748 reports every
// client error as 500 server_error.
func (l *LlamaCpp) WriteError(w http.ResponseWriter, kind ErrorKind, msg string) {
	status, typ := http.StatusInternalServerError, "server_error"
	switch kind {
	case KindInvalidJSON:
		msg = "[json.exception.parse_error.101] parse error: " + msg
	case KindInvalidRequest, KindModelNotFound, KindEngineFailure:
	case KindUnauthorized:
		status, typ, msg = http.StatusUnauthorized, "authentication_error", "Invalid API Key"
	case KindLoading:
		status, typ, msg = http.StatusServiceUnavailable, "unavailable_error", "Loading model"
	case KindRouteNotFound:
		status, typ, msg = http.StatusNotFound, "not_found_error", "File Not Found"
	case KindNotSupported:
		status, typ = http.StatusNotImplemented, "not_supported_error"
	case kindExceedsContext:
		status, typ = http.StatusBadRequest, "invalid_request_error"
	}
	WriteJSON(w, status, llamaError{Error: llamaErrorBody{Code: status, Message: msg, Type: typ}})
}

// PrepareChat accepts any model name and names the answer after the
// request, the alias or "gpt-3.5-turbo". With --no-context-shift a prompt
// longer than a slot's context is refused.
func (l *LlamaCpp) PrepareChat(e *Engine, r *http.Request, req *ChatRequest) error {
	if n := countPromptTokens(req.Messages); l.opts.NoContextShift && n > l.SlotContext() {
		return &APIError{Kind: kindExceedsContext, Message: "the request exceeds the available context size. try increasing the context size or enable context shift"}
	}
	if raw, ok := req.Raw["n"]; ok && string(raw) != "1" {
		return &APIError{Kind: KindInvalidRequest, Message: "Only one completion choice is allowed"}
	}
	req.ID = randomAlnum(32)
	switch {
	case req.Model != "":
		req.ResponseModel = req.Model
	case l.opts.Alias != "":
		req.ResponseModel = l.opts.Alias
	default:
		req.ResponseModel = "gpt-3.5-turbo"
	}
	return nil
}

// LlamaTimings are llama-server's per-answer figures.
type LlamaTimings struct {
	PromptN             int     `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

// timings derives deterministic figures from the counts and the token
// rate.
func (l *LlamaCpp) timings(promptN, predicted int) *LlamaTimings {
	perToken := 0.301
	if r := l.opts.TokenRate; r > 0 {
		perToken = 1000 / r
	}
	t := &LlamaTimings{
		PromptN: promptN, PromptMS: float64(promptN) * 0.082, PromptPerTokenMS: 0.082,
		PredictedN: predicted, PredictedMS: float64(predicted) * perToken, PredictedPerTokenMS: perToken,
	}
	if t.PromptMS > 0 {
		t.PromptPerSecond = 1000 / t.PromptPerTokenMS
	}
	if t.PredictedMS > 0 {
		t.PredictedPerSecond = 1000 / perToken
	}
	return t
}

// llamaCompletion is a non-streamed chat answer, fields in b4748's order.
type llamaCompletion struct {
	Choices           []Choice      `json:"choices"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	SystemFingerprint string        `json:"system_fingerprint"`
	Object            string        `json:"object"`
	Usage             *Usage        `json:"usage"`
	ID                string        `json:"id"`
	Timings           *LlamaTimings `json:"timings"`
}

// llamaChunk is a streamed chunk; the last one carries usage and timings.
type llamaChunk struct {
	Choices           []Choice      `json:"choices"`
	Created           int64         `json:"created"`
	ID                string        `json:"id"`
	Model             string        `json:"model"`
	SystemFingerprint string        `json:"system_fingerprint"`
	Object            string        `json:"object"`
	Usage             *Usage        `json:"usage,omitempty"`
	Timings           *LlamaTimings `json:"timings,omitempty"`
}

// ChatResponse is a chat.completion with usage and timings.
func (l *LlamaCpp) ChatResponse(res *ChatResult) any {
	return llamaCompletion{
		Choices:           []Choice{{Index: 0, Message: wholeMessage(res), FinishReason: res.FinishReason}},
		Created:           res.Created,
		Model:             res.Model,
		SystemFingerprint: LlamaCppBuild,
		Object:            "chat.completion",
		Usage:             UsageOf(res),
		ID:                res.ID,
		Timings:           l.timings(res.PromptTokens, res.CompletionTokens),
	}
}

// ChatStream has no role chunk and ends with a chunk that carries the
// finish reason, usage and timings.
func (l *LlamaCpp) ChatStream(req *ChatRequest, meta ChatMeta) ChatStream {
	return &llamaStream{l: l, meta: meta}
}

type llamaStream struct {
	l    *LlamaCpp
	meta ChatMeta
}

func (s *llamaStream) chunk(choices []Choice) llamaChunk {
	return llamaChunk{Choices: choices, Created: s.meta.Created, ID: s.meta.ID, Model: s.meta.Model,
		SystemFingerprint: LlamaCppBuild, Object: "chat.completion.chunk"}
}

// Open sends nothing: b4748 sends no role chunk.
func (s *llamaStream) Open() []byte { return nil }

// Token sends one piece of content.
func (s *llamaStream) Token(text string) []byte {
	return SSEData(s.chunk([]Choice{{Delta: &Delta{Content: text}}}))
}

// Close sends the last chunk (empty delta, finish reason, usage, timings)
// and [DONE].
func (s *llamaStream) Close(res *ChatResult) []byte {
	c := s.chunk([]Choice{{Delta: &Delta{}, FinishReason: res.FinishReason}})
	c.Usage = UsageOf(res)
	c.Timings = s.l.timings(res.PromptTokens, res.CompletionTokens)
	return append(SSEData(c), SSEDone...)
}

// servedID is the model's id: the alias, else the -m path.
func (l *LlamaCpp) servedID(e *Engine) string {
	if l.opts.Alias != "" {
		return l.opts.Alias
	}
	if l.opts.ModelPath != "" {
		return l.opts.ModelPath
	}
	return e.ServedName()
}

func (l *LlamaCpp) models(e *Engine, w http.ResponseWriter, r *http.Request) {
	meta := l.opts.Meta
	WriteJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": l.servedID(e), "object": "model", "created": time.Now().Unix(), "owned_by": "llamacpp", "meta": meta,
		}},
	})
}

// slotJSON is one slot of /slots and /props.
func (l *LlamaCpp) slotJSON(id int, processing bool) map[string]any {
	task := -1
	if processing {
		task = id + 1
	}
	return map[string]any{
		"id": id, "id_task": task, "n_ctx": l.SlotContext(), "speculative": false, "is_processing": processing, "non_causal": false,
		"params":     map[string]any{"n_predict": -1, "seed": uint32(4294967295), "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "stream": true},
		"prompt":     "",
		"next_token": map[string]any{"has_next_token": processing, "has_new_line": false, "n_remain": -1, "n_decoded": 0, "stopping_word": ""},
	}
}

func (l *LlamaCpp) props(e *Engine, w http.ResponseWriter, r *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": l.slotJSON(0, false),
		"total_slots":                 l.opts.Parallel,
		"model_path":                  l.opts.ModelPath,
		"chat_template":               l.opts.ChatTemplate,
		"bos_token":                   "<s>",
		"eos_token":                   "</s>",
		"build_info":                  LlamaCppBuild,
	})
}

func (l *LlamaCpp) setProps(e *Engine, w http.ResponseWriter, r *http.Request) {
	if !l.opts.Props {
		l.WriteError(w, KindNotSupported, "This server does not support changing global properties. Start it with `--props`")
		return
	}
	WriteJSON(w, http.StatusOK, map[string]bool{"success": true})
}

func (l *LlamaCpp) slots(e *Engine, w http.ResponseWriter, r *http.Request) {
	if !l.opts.Slots {
		l.WriteError(w, KindNotSupported, "This server does not support slots endpoint. Start it with `--slots`")
		return
	}
	e.Activity() // a task's result, as every /slots answer is
	running, _ := e.slots.counts()
	if r.URL.Query().Get("fail_on_no_slot") != "" && running >= l.opts.Parallel {
		WriteJSON(w, http.StatusServiceUnavailable, llamaError{Error: llamaErrorBody{Code: 503, Message: "no slot available", Type: "unavailable_error"}})
		return
	}
	out := make([]map[string]any, l.opts.Parallel)
	for i := range out {
		out[i] = l.slotJSON(i, i < running)
	}
	WriteJSON(w, http.StatusOK, out)
}

// LlamaCppMetrics are llama-server's metrics for a stats snapshot, those of
// a current build (LlamaCppFacts): no KV usage gauge, which builds after
// early 2025 no longer serve.
func LlamaCppMetrics(s Stats, slotCtx int) []Metric {
	m := func(name, typ, help string, v float64) Metric {
		return Metric{Name: "llamacpp:" + name, Type: typ, Help: help, Value: v}
	}
	busy := 0.0
	if s.MaxRunning > 0 {
		busy = float64(s.Running) / float64(s.MaxRunning)
	}
	return []Metric{
		m("prompt_tokens_total", "counter", "Number of prompt tokens processed.", float64(s.PromptTokens)),
		m("prompt_seconds_total", "counter", "Prompt process time", float64(s.PromptTokens)*0.000082),
		m("tokens_predicted_total", "counter", "Number of generation tokens processed.", float64(s.GenerationTokens)),
		m("tokens_predicted_seconds_total", "counter", "Predict process time", float64(s.GenerationTokens)*0.000301),
		m("n_decode_total", "counter", "Total number of llama_decode() calls", float64(s.GenerationTokens)),
		m("n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call", float64(s.Running)),
		m("n_tokens_max", "counter", "Largest observed n_tokens.", busy*float64(slotCtx)),
		m("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", 12188.66),
		m("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", 3318.13),
		m("requests_processing", "gauge", "Number of requests processing.", float64(s.Running)),
		m("requests_deferred", "gauge", "Number of requests deferred.", float64(s.Waiting)),
	}
}

// embeddings serves POST /v1/embeddings when started with --embeddings.
func (l *LlamaCpp) embeddings(e *Engine, w http.ResponseWriter, r *http.Request) {
	if !l.opts.Embeddings {
		l.WriteError(w, KindNotSupported, "This server does not support embeddings. Start it with `--embeddings`")
		return
	}
	e.EmbeddingsHandler(false).ServeHTTP(w, r)
}

// rerank serves POST /v1/rerank and /rerank when started with
// --reranking.
func (l *LlamaCpp) rerank(e *Engine, w http.ResponseWriter, r *http.Request) {
	if !l.opts.Reranking {
		l.WriteError(w, KindNotSupported, "This server does not support reranking. Start it with `--reranking`")
		return
	}
	e.RerankHandler(false).ServeHTTP(w, r)
}

func (l *LlamaCpp) metrics(e *Engine, w http.ResponseWriter, r *http.Request) {
	if !l.opts.Metrics {
		l.WriteError(w, KindNotSupported, "This server does not support metrics endpoint. Start it with `--metrics`")
		return
	}
	e.Activity() // a task's result, as every /metrics answer is
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	// b4748 sends a bogus value here; so does the fake.
	w.Header().Set("Process-Start-Time-Unix", "417228438")
	WritePrometheus(w, LlamaCppMetrics(e.Stats(), l.SlotContext()))
}

// decide answers a decision request in a slot, as a decision model on
// llama-server does.
func (l *LlamaCpp) decide(e *Engine, w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes))
	if err != nil {
		return
	}
	var req decisions.Request
	if err := json.Unmarshal(body, &req); err != nil {
		l.WriteError(w, KindInvalidJSON, err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		l.WriteError(w, KindInvalidRequest, err.Error())
		return
	}
	if err := e.slots.acquire(r.Context()); err != nil {
		return // the client went away while waiting
	}
	defer e.slots.release()
	resp := DecisionAnswer(e.ServedName(), &req)
	resp.ID = "decision-" + randomAlnum(24)
	if req.Model == "" {
		resp.Model = l.servedID(e)
	}
	t := l.timings(int(resp.Usage.PromptTokens), int(resp.Usage.CompletionTokens))
	resp.Timings = map[string]float64{"prompt_n": float64(t.PromptN), "prompt_ms": t.PromptMS, "predicted_n": float64(t.PredictedN), "predicted_ms": t.PredictedMS}
	WriteJSON(w, http.StatusOK, resp)
}

// DecisionAnswer is the deterministic answer of a fake decision model: for
// every question a complete probability set drawn from a hash of the
// served name, the state, the question and the label, and the expected
// value of a score.
func DecisionAnswer(served string, req *decisions.Request) *decisions.Response {
	prompt := int64(len(strings.Fields(req.State)) + 8)
	resp := &decisions.Response{
		Object: decisions.Object, Created: time.Now().Unix(), Model: req.Model,
		Usage: decisions.Usage{PromptTokens: prompt, CompletionTokens: int64(len(req.Questions)), TotalTokens: prompt + int64(len(req.Questions))},
	}
	for _, q := range req.Questions {
		labels := q.Labels()
		probs := make(map[string]float64, len(labels))
		sum := 0.0
		for _, lb := range labels {
			h := fnv.New64a()
			fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", served, req.State, q.Text, lb)
			p := float64(h.Sum64()%1000) + 1
			probs[lb] = p
			sum += p
		}
		for lb := range probs {
			probs[lb] /= sum
		}
		a := decisions.Answer{ID: q.ID, Type: q.Type, Probabilities: probs}
		if q.Type == decisions.TypeScore {
			x := decisions.Expected(q, probs)
			a.Expected = &x
		}
		resp.Answers = append(resp.Answers, a)
	}
	return resp
}

// randomAlnum is n random letters and digits (llama-server's ids).
func randomAlnum(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
