// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// NewInferenceHandler returns the inference API: /v1/models,
// /v1/chat/completions and /v1/systemone (decision requests), behind the
// API key. The core's Prometheus metrics are on the management listener
// (MetricsView), not here.
func NewInferenceHandler(b *Backend, apiKey string) http.Handler {
	r := mux.NewRouter()
	r.HandleFunc("/v1/models", b.Router.Models).Methods(http.MethodGet)
	r.HandleFunc("/v1/chat/completions", b.Router.ChatCompletions).Methods(http.MethodPost)
	r.HandleFunc("/v1/completions", b.Router.Completions).Methods(http.MethodPost)
	r.HandleFunc("/v1/embeddings", b.Router.Embeddings).Methods(http.MethodPost)
	r.HandleFunc("/v1/rerank", b.Router.Rerank).Methods(http.MethodPost)
	r.HandleFunc(decisions.Path, b.Router.Decisions).Methods(http.MethodPost)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		router.WriteError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", req.Method, req.URL.Path))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		router.WriteError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", req.Method, req.URL.Path))
	})
	return inferenceAuth(r, apiKey)
}

// InferenceAuth is inferenceAuth for a handler of another role's making
// (the server's relay): the same key check, answers and connection
// accounting.
func InferenceAuth(next http.Handler, apiKey string) http.Handler { return inferenceAuth(next, apiKey) }

// inferenceAuth requires the API key on every route. There is no fallback
// key and no unauthenticated route. A request without the key is answered
// 401 without reading its body, on a connection closed after the answer.
func inferenceAuth(next http.Handler, apiKey string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokenEqual(bearer(r), apiKey) {
			// IMPORTANT: the body of an unauthenticated request is never
			// read, and its connection is closed after the 401.
			closeUnread(w)
			w.Header().Set(router.HeaderRequestID, router.NewRequestID())
			w.Header().Set("WWW-Authenticate", `Bearer realm="capyctl"`)
			router.WriteError(w, structs.Errf(structs.CodeUnauthorized, "missing or wrong API key (send Authorization: Bearer <key>)"))
			return
		}
		markAuthenticated(r)
		next.ServeHTTP(w, r)
	})
}
