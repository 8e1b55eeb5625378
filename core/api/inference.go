// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// NewInferenceHandler returns the inference API: /v1/models,
// /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank,
// /v1/systemone (decision requests), OpenAI's Responses API
// (/v1/responses, with GET and DELETE of a stored response) and
// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens),
// behind the API key. The core's Prometheus metrics are on the management
// listener (MetricsView), not here.
func NewInferenceHandler(b *Backend, apiKey string) http.Handler {
	r := mux.NewRouter()
	r.HandleFunc("/v1/models", b.Router.Models).Methods(http.MethodGet)
	r.HandleFunc("/v1/chat/completions", b.Router.ChatCompletions).Methods(http.MethodPost)
	r.HandleFunc("/v1/completions", b.Router.Completions).Methods(http.MethodPost)
	r.HandleFunc("/v1/embeddings", b.Router.Embeddings).Methods(http.MethodPost)
	r.HandleFunc("/v1/rerank", b.Router.Rerank).Methods(http.MethodPost)
	r.HandleFunc(decisions.Path, b.Router.Decisions).Methods(http.MethodPost)
	r.HandleFunc(router.ResponsesPath, b.Router.Responses).Methods(http.MethodPost)
	r.HandleFunc(router.ResponsesPath+"/{id}", b.getResponse).Methods(http.MethodGet)
	r.HandleFunc(router.ResponsesPath+"/{id}", b.deleteResponse).Methods(http.MethodDelete)
	r.HandleFunc(router.ResponsesPath+"/{id}/input_items", b.responseInputItems).Methods(http.MethodGet)
	r.HandleFunc(router.MessagesPath, b.Router.Messages).Methods(http.MethodPost)
	r.HandleFunc(router.CountTokensPath, b.Router.CountTokens).Methods(http.MethodPost)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		writeInferenceError(w, req, structs.Errf(structs.CodeNotFound, "no route %s %s", req.Method, req.URL.Path))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		writeInferenceError(w, req, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", req.Method, req.URL.Path))
	})
	return inferenceAuth(r, apiKey)
}

// InferenceAuth is inferenceAuth for a handler of another role's making
// (the server's relay): the same key check, answers and connection
// accounting.
func InferenceAuth(next http.Handler, apiKey string) http.Handler { return inferenceAuth(next, apiKey) }

// anthropicPath reports a path of Anthropic's Messages API, whose answers
// (errors included) are in Anthropic's shape.
func anthropicPath(p string) bool {
	return p == router.MessagesPath || strings.HasPrefix(p, router.MessagesPath+"/")
}

// writeInferenceError answers an error made outside the router: in
// Anthropic's shape on the Messages routes, CapyCTL's elsewhere.
func writeInferenceError(w http.ResponseWriter, r *http.Request, err error) {
	if w.Header().Get(router.HeaderRequestID) == "" {
		w.Header().Set(router.HeaderRequestID, router.NewRequestID())
	}
	if anthropicPath(r.URL.Path) {
		router.WriteAnthropicError(w, err)
		return
	}
	router.WriteError(w, err)
}

// apiKeyOf is the key a request carries: Authorization: Bearer (every
// route), else x-api-key (Anthropic's header, which its SDK and Claude
// Code send).
func apiKeyOf(r *http.Request) string {
	if k := bearer(r); k != "" {
		return k
	}
	return strings.TrimSpace(r.Header.Get("X-Api-Key"))
}

// inferenceAuth requires the API key on every route. There is no fallback
// key and no unauthenticated route. A request without the key is answered
// 401 without reading its body, on a connection closed after the answer.
// An authenticated request carries its key's identity (router.Caller) to
// what it stores.
func inferenceAuth(next http.Handler, apiKey string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokenEqual(apiKeyOf(r), apiKey) {
			// IMPORTANT: the body of an unauthenticated request is never
			// read, and its connection is closed after the 401.
			closeUnread(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="capyctl"`)
			writeInferenceError(w, r, structs.Errf(structs.CodeUnauthorized, "missing or wrong API key (send Authorization: Bearer <key>, or x-api-key: <key>)"))
			return
		}
		markAuthenticated(r)
		// The role's one key; named keys put their own name here.
		next.ServeHTTP(w, r.WithContext(router.WithCaller(r.Context(), router.Caller{Key: router.DefaultKeyName})))
	})
}
