// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"fmt"
	"net/http"
	"time"
)

// OpenAI is the generic flavour: a plain OpenAI-compatible server.
//
//	GET  /health               503 {"status":"loading"} while loading, then 200 {"status":"ok"}
//	GET  /v1/models            the served model; 503 while loading
//	POST /v1/chat/completions  Engine.ChatHandler
//	POST /v1/completions       Engine.CompletionsHandler
//	POST /v1/embeddings        Engine.EmbeddingsHandler (vLLM's shape, with an id)
//	POST /v1/rerank            Engine.RerankHandler (vLLM's shape, with an id)
//	GET  /metrics              fake:requests_running, fake:requests_waiting, counters
//	GET  /fake/stats           Engine.StatsHandler
//
// Every route but /health needs the API key when one is set. Errors use
// OpenAI's envelope {"error":{"message","type","code"}}. The request ID is
// the X-Request-Id header when given.
type OpenAI struct{}

var _ Flavour = OpenAI{}

// Name is "openai".
func (OpenAI) Name() string { return "openai" }

// Routes lists the generic routes.
func (OpenAI) Routes(e *Engine) []Route {
	return []Route{
		{Pattern: "GET /health", Handler: OpenAIHealthHandler(e)},
		{Pattern: "GET /v1/models", Handler: OpenAIModelsHandler(e, "fake")},
		{Pattern: "POST /v1/chat/completions", Handler: e.ChatHandler()},
		{Pattern: "POST /v1/completions", Handler: e.CompletionsHandler()},
		{Pattern: "POST /v1/embeddings", Handler: e.EmbeddingsHandler(true)},
		{Pattern: "POST /v1/rerank", Handler: e.RerankHandler(true)},
		{Pattern: "GET /metrics", Handler: MetricsHandler(e, OpenAIMetrics)},
		{Pattern: "GET /fake/stats", Handler: e.StatsHandler()},
	}
}

// Middleware requires the API key everywhere but GET /health.
func (OpenAI) Middleware(e *Engine, next http.Handler) http.Handler {
	public := func(r *http.Request) bool { return r.URL.Path == "/health" }
	deny := func(w http.ResponseWriter, r *http.Request) {
		e.Flavour().WriteError(w, KindUnauthorized, "invalid api key")
	}
	return APIKeyMiddleware(e.Config().APIKey, public, nil, deny)(next)
}

// AcceptWhileLoading is true: the port answers (503) during the startup.
func (OpenAI) AcceptWhileLoading() bool { return true }

// SignalExitCode is 0.
func (OpenAI) SignalExitCode() int { return 0 }

// FormatLog writes "INFO 2006-01-02 15:04:05.000 message".
func (OpenAI) FormatLog(t time.Time, level Level, msg string) string {
	return fmt.Sprintf("%s %s %s", level, t.Format("2006-01-02 15:04:05.000"), msg)
}

// OpenAIError is OpenAI's error envelope.
type OpenAIError struct {
	// Error is the error.
	Error OpenAIErrorBody `json:"error"`
}

// OpenAIErrorBody is the inside of OpenAIError.
type OpenAIErrorBody struct {
	// Message is the human-readable text.
	Message string `json:"message"`
	// Type is the error class ("invalid_request_error", "server_error").
	Type string `json:"type"`
	// Code is a machine-readable code, omitted when empty.
	Code string `json:"code,omitempty"`
}

// WriteError maps kinds to OpenAI's statuses and types.
func (OpenAI) WriteError(w http.ResponseWriter, kind ErrorKind, msg string) {
	status, typ, code := http.StatusBadRequest, "invalid_request_error", ""
	switch kind {
	case KindInvalidJSON, KindInvalidRequest:
	case KindModelNotFound:
		status, code = http.StatusNotFound, "model_not_found"
	case KindUnauthorized:
		status, code = http.StatusUnauthorized, "invalid_api_key"
	case KindLoading:
		status, typ, code = http.StatusServiceUnavailable, "unavailable_error", "model_loading"
	case KindEngineFailure:
		status, typ = http.StatusInternalServerError, "server_error"
	case KindRouteNotFound:
		status, code = http.StatusNotFound, "not_found"
	case KindNotSupported:
		status, typ = http.StatusNotImplemented, "not_supported_error"
	default:
		status, typ = http.StatusInternalServerError, "server_error"
	}
	WriteJSON(w, status, OpenAIError{Error: OpenAIErrorBody{Message: msg, Type: typ, Code: code}})
}

// PrepareChat requires model to be the served name and takes the request
// ID from X-Request-Id.
func (OpenAI) PrepareChat(e *Engine, r *http.Request, req *ChatRequest) error {
	if req.Model != e.ServedName() {
		return &APIError{Kind: KindModelNotFound, Message: fmt.Sprintf("The model `%s` does not exist.", req.Model)}
	}
	req.ID = r.Header.Get("X-Request-Id")
	req.ResponseModel = req.Model
	return nil
}

// ChatResponse is an OpenAI chat.completion.
func (OpenAI) ChatResponse(res *ChatResult) any {
	return ChatCompletion{
		ID:      res.ID,
		Object:  "chat.completion",
		Created: res.Created,
		Model:   res.Model,
		Choices: []Choice{{
			Index:        0,
			Message:      wholeMessage(res),
			FinishReason: res.FinishReason,
		}},
		Usage: UsageOf(res),
	}
}

// ChatStream is an OpenAIStream with a role chunk and, on request, the
// usage chunk.
func (OpenAI) ChatStream(req *ChatRequest, meta ChatMeta) ChatStream {
	return &OpenAIStream{Meta: meta, RoleChunk: true, UsageChunk: req.IncludeUsage()}
}

// ChatCompletion is an OpenAI chat.completion body.
type ChatCompletion struct {
	// ID is "chatcmpl-…".
	ID string `json:"id"`
	// Object is "chat.completion".
	Object string `json:"object"`
	// Created is a Unix time.
	Created int64 `json:"created"`
	// Model is the answering model's name.
	Model string `json:"model"`
	// Choices holds one choice.
	Choices []Choice `json:"choices"`
	// Usage counts tokens.
	Usage *Usage `json:"usage,omitempty"`
}

// ChatCompletionChunk is one streamed chat.completion.chunk.
type ChatCompletionChunk struct {
	// ID is the answer's id, the same on every chunk.
	ID string `json:"id"`
	// Object is "chat.completion.chunk".
	Object string `json:"object"`
	// Created is a Unix time, the same on every chunk.
	Created int64 `json:"created"`
	// Model is the answering model's name.
	Model string `json:"model"`
	// Choices holds one choice, or none in the usage chunk.
	Choices []Choice `json:"choices"`
	// Usage is set in the usage chunk only.
	Usage *Usage `json:"usage,omitempty"`
}

// Choice is a choice of a completion (Message) or of a chunk (Delta).
type Choice struct {
	// Index is 0.
	Index int `json:"index"`
	// Message is the answer of a completion.
	Message *ChatMessage `json:"message,omitempty"`
	// Delta is the piece of a chunk.
	Delta *Delta `json:"delta,omitempty"`
	// FinishReason is null until the end.
	FinishReason any `json:"finish_reason"`
}

// ChatMessage is an answer's message.
type ChatMessage struct {
	// Role is "assistant".
	Role string `json:"role"`
	// Content is the text (null beside tool calls).
	Content string `json:"content"`
	// ToolCalls are the function calls the answer makes (tools.go).
	ToolCalls []WholeToolCall `json:"tool_calls,omitempty"`
}

// Delta is a chunk's piece of the message.
type Delta struct {
	// Role is set in the first chunk.
	Role string `json:"role,omitempty"`
	// Content is a piece of text.
	Content string `json:"content,omitempty"`
}

// Usage counts an answer's tokens.
type Usage struct {
	// PromptTokens counts the prompt.
	PromptTokens int `json:"prompt_tokens"`
	// CompletionTokens counts the answer.
	CompletionTokens int `json:"completion_tokens"`
	// TotalTokens is the sum.
	TotalTokens int `json:"total_tokens"`
	// PromptTokensDetails says how many prompt tokens came from a cache
	// (OpenAI's usage.prompt_tokens_details.cached_tokens, which vLLM and
	// SGLang report), absent when none did.
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is usage.prompt_tokens_details.
type PromptTokensDetails struct {
	// CachedTokens were not prefilled.
	CachedTokens int `json:"cached_tokens"`
}

// UsageOf counts a result.
func UsageOf(res *ChatResult) *Usage {
	u := &Usage{
		PromptTokens:     res.PromptTokens,
		CompletionTokens: res.CompletionTokens,
		TotalTokens:      res.PromptTokens + res.CompletionTokens,
	}
	if res.CachedTokens > 0 {
		u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: res.CachedTokens}
	}
	return u
}

// OpenAIStream encodes an OpenAI chat stream: an optional role chunk, a
// chunk per piece of content, a chunk with the finish reason and an empty
// delta, an optional usage chunk with "choices":[], then "data: [DONE]".
type OpenAIStream struct {
	// Meta is repeated on every chunk.
	Meta ChatMeta
	// RoleChunk sends {"role":"assistant"} first.
	RoleChunk bool
	// UsageChunk sends the usage chunk (stream_options.include_usage).
	UsageChunk bool
}

// chunk builds a chunk with meta.
func (s *OpenAIStream) chunk(choices []Choice, usage *Usage) ChatCompletionChunk {
	return ChatCompletionChunk{
		ID: s.Meta.ID, Object: "chat.completion.chunk", Created: s.Meta.Created, Model: s.Meta.Model,
		Choices: choices, Usage: usage,
	}
}

// Open sends the role chunk if asked.
func (s *OpenAIStream) Open() []byte {
	if !s.RoleChunk {
		return nil
	}
	return SSEData(s.chunk([]Choice{{Delta: &Delta{Role: "assistant"}}}, nil))
}

// Token sends one piece of content.
func (s *OpenAIStream) Token(text string) []byte {
	return SSEData(s.chunk([]Choice{{Delta: &Delta{Content: text}}}, nil))
}

// Close sends the finish chunk, the usage chunk if asked, and [DONE].
func (s *OpenAIStream) Close(res *ChatResult) []byte {
	out := SSEData(s.chunk([]Choice{{Delta: &Delta{}, FinishReason: res.FinishReason}}, nil))
	if s.UsageChunk {
		out = append(out, SSEData(s.chunk([]Choice{}, UsageOf(res)))...)
	}
	return append(out, SSEDone...)
}

// OpenAIHealthHandler answers 503 {"status":"loading"} during the startup
// and 200 {"status":"ok"} after (parked included).
func OpenAIHealthHandler(e *Engine) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e.Phase() == PhaseLoading {
			WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading"})
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

// ModelList is OpenAI's model list.
type ModelList struct {
	// Object is "list".
	Object string `json:"object"`
	// Data holds the model cards.
	Data []ModelCard `json:"data"`
}

// ModelCard is one model of a ModelList.
type ModelCard struct {
	// ID is the served name.
	ID string `json:"id"`
	// Object is "model".
	Object string `json:"object"`
	// Created is a Unix time.
	Created int64 `json:"created"`
	// OwnedBy names the engine family.
	OwnedBy string `json:"owned_by"`
}

// OpenAIModelsHandler lists the served model, owned by ownedBy; while
// loading it answers the flavour's KindLoading error.
func OpenAIModelsHandler(e *Engine, ownedBy string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e.Phase() == PhaseLoading {
			e.Flavour().WriteError(w, KindLoading, "model is loading")
			return
		}
		WriteJSON(w, http.StatusOK, ModelList{Object: "list", Data: []ModelCard{{
			ID: e.ServedName(), Object: "model", Created: e.Created().Unix(), OwnedBy: ownedBy,
		}}})
	})
}

// MetricsHandler serves the metrics that render returns for the engine's
// current Stats, in the Prometheus text format.
func MetricsHandler(e *Engine, render func(Stats) []Metric) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", PrometheusContentType)
		WritePrometheus(w, render(e.Stats()))
	})
}

// OpenAIMetrics are the generic flavour's metrics (no labels).
func OpenAIMetrics(s Stats) []Metric {
	return []Metric{
		{Name: "fake:requests_running", Type: "gauge", Help: "Requests generating now.", Value: float64(s.Running)},
		{Name: "fake:requests_waiting", Type: "gauge", Help: "Requests waiting for a slot.", Value: float64(s.Waiting)},
		{Name: "fake:requests_total", Type: "counter", Help: "Chat requests accepted.", Value: float64(s.Total)},
		{Name: "fake:requests_completed_total", Type: "counter", Help: "Chat requests answered in full.", Value: float64(s.Completed)},
		{Name: "fake:requests_cancelled_total", Type: "counter", Help: "Chat requests cancelled.", Value: float64(s.Cancelled)},
		{Name: "fake:requests_failed_total", Type: "counter", Help: "Chat requests failed by the engine.", Value: float64(s.Failed)},
		{Name: "fake:prompt_tokens_total", Type: "counter", Help: "Prompt tokens processed.", Value: float64(s.PromptTokens)},
		{Name: "fake:generation_tokens_total", Type: "counter", Help: "Tokens generated.", Value: float64(s.GenerationTokens)},
	}
}
