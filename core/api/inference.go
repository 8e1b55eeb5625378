// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"math"
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/apikeys"
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
func NewInferenceHandler(b *Backend, keys *apikeys.Keeper, o AuthOptions) http.Handler {
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
	return InferenceAuth(r, keys, o)
}

// AuthOptions tune the inference API's authentication.
type AuthOptions struct {
	// FailuresPerMinute is how many failed authentications a client
	// address may make per minute (0: DefaultAuthFailuresPerMinute;
	// negative: no bound).
	FailuresPerMinute int
}

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

// InferenceAuth requires an API key on every route (the server role's
// relay uses it too). There is no fallback key and no unauthenticated
// route. A request without a key that authenticates is answered 401
// without reading its body, on a connection closed after the answer; a
// client address that failed too often is answered 429 rate_limited the
// same way, before its key is looked at. An authenticated request takes
// its share of its key's limits (429 rate_limited or quota_exceeded when
// over one, the OpenAI-style x-ratelimit-* headers on every answer) and
// carries its key's identity, scope and meter (router.Caller).
func InferenceAuth(next http.Handler, keys *apikeys.Keeper, o AuthOptions) http.Handler {
	perMinute := o.FailuresPerMinute
	if perMinute == 0 {
		perMinute = DefaultAuthFailuresPerMinute
	}
	guard := newAuthGuard(perMinute)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := clientHost(r)
		if wait := guard.blocked(addr); wait > 0 {
			// IMPORTANT: as for a wrong key: the body is never read.
			closeUnread(w)
			e := structs.Errf(structs.CodeRateLimited, "too many failed authentications from this address; retry later")
			e.RetryAfter = int(math.Ceil(wait.Seconds()))
			writeInferenceError(w, r, e)
			return
		}
		p, err := keys.Authenticate(apiKeyOf(r))
		if err != nil {
			guard.failed(addr)
			// IMPORTANT: the body of an unauthenticated request is never
			// read, and its connection is closed after the 401.
			closeUnread(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="capyctl"`)
			writeInferenceError(w, r, err)
			return
		}
		markAuthenticated(r)
		var hdr apikeys.RateHeaders
		ticket, err := p.Admit(&hdr)
		hdr.Apply(w.Header())
		if err != nil {
			writeInferenceError(w, r, err)
			return
		}
		c := router.Caller{Key: p.Key.Name, Weight: p.Key.EffectiveWeight(), Meter: ticket}
		if p.Scope != nil {
			c.Scope = p.Scope
		}
		if name, weight, ok := router.RelayedKeyOf(r.Context()); ok {
			// A server relayed it (the host's relay, the host's own key):
			// the request is the client's key's, for its fair share of
			// places and the request log.
			c.Key, c.Weight = name, max(weight, 1)
		}
		next.ServeHTTP(w, r.WithContext(router.WithCaller(r.Context(), c)))
		// A request the router took over (a stream may outlive this
		// handler) is settled when it ends; any other ends here.
		ticket.EndUntaken()
	})
}
