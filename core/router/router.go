// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package router is the inference hot path: resolve the model, activate it
// when needed, admit the request, forward it to the engine's loopback
// endpoint over pooled keep-alive connections, and relay the answer chunk by
// chunk. It never calls a driver synchronously.
package router

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/structs"
)

// Header names.
const (
	HeaderRequestID       = "X-CapyCTL-Request-Id"
	HeaderClientRequestID = "X-Request-Id"
)

// Lifecycle is what the router needs of the lifecycle.
type Lifecycle interface {
	Routes() *lifecycle.RouteTable
	Activate(ctx context.Context, deployment string) error
}

// Config configures a Router.
type Config struct {
	Lifecycle Lifecycle
	Logger    hclog.Logger
	// MaxBodyBytes bounds a request body (default 64 MiB).
	MaxBodyBytes int64
	// DefaultDeadline bounds a request until its first output when the
	// deployment sets none (default 600s).
	DefaultDeadline time.Duration
}

// Router serves the inference API's model routes.
type Router struct {
	cfg       Config
	logger    hclog.Logger
	transport *http.Transport
	client    *http.Client

	mu     sync.Mutex
	places map[string]*places

	inFlight atomic.Int64
}

// places bounds concurrent requests per deployment.
type places struct{ sem chan struct{} }

// New returns a Router.
func New(cfg Config) *Router {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.DefaultDeadline == 0 {
		cfg.DefaultDeadline = 600 * time.Second
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ResponseHeaderTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
	return &Router{
		cfg:       cfg,
		logger:    cfg.Logger.Named("router"),
		transport: tr,
		client:    &http.Client{Transport: tr},
		places:    map[string]*places{},
	}
}

// Close drops idle engine connections.
func (rt *Router) Close() { rt.transport.CloseIdleConnections() }

// InFlight returns the number of requests being served.
func (rt *Router) InFlight() int64 { return rt.inFlight.Load() }

// NewRequestID returns a fresh request ID.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "capy-" + hex.EncodeToString(b[:])
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

// WriteError writes the inference API's error envelope.
func WriteError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	info := e.Info()
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	} else if info.HTTP == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(info.HTTP)
	body := map[string]any{"error": map[string]any{"code": string(e.Code), "message": e.Message, "retryable": info.Retryable}}
	_ = json.NewEncoder(w).Encode(body)
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
	for _, route := range rt.cfg.Lifecycle.Routes().List() {
		state := "stopped"
		if len(route.Ready) > 0 {
			state = "ready"
		}
		for _, name := range route.Routes {
			out.Data = append(out.Data, model{
				ID: name, Object: "model", OwnedBy: "capyctl",
				CapyCTL: map[string]any{"api": route.API, "deployment": route.Deployment, "state": state},
			})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// requestHead is the part of a request body the router reads.
type requestHead struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// ChatCompletions serves POST /v1/chat/completions.
func (rt *Router) ChatCompletions(w http.ResponseWriter, r *http.Request) {
	rt.serve(w, r, structs.APIChat)
}

func (rt *Router) serve(w http.ResponseWriter, r *http.Request, api string) {
	rt.inFlight.Add(1)
	defer rt.inFlight.Add(-1)
	reqID := NewRequestID()
	w.Header().Set(HeaderRequestID, reqID)
	if cid := r.Header.Get(HeaderClientRequestID); cid != "" && ValidClientRequestID(cid) {
		w.Header().Set(HeaderClientRequestID, cid)
	}

	// IMPORTANT: read the whole body before forwarding (Go issue 40747: a
	// reverse proxy that streams the request body can have the engine
	// connection closed under a fast answer), and to find the model.
	body, err := io.ReadAll(io.LimitReader(r.Body, rt.cfg.MaxBodyBytes+1))
	if err != nil {
		WriteError(w, structs.Errf(structs.CodeInvalidRequest, "read request body: %v", err))
		return
	}
	if int64(len(body)) > rt.cfg.MaxBodyBytes {
		WriteError(w, structs.Errf(structs.CodeRequestTooLarge, "request body is over %d bytes", rt.cfg.MaxBodyBytes))
		return
	}
	var head requestHead
	if err := json.Unmarshal(body, &head); err != nil {
		WriteError(w, structs.Errf(structs.CodeInvalidRequest, "request body is not JSON: %v", err))
		return
	}
	if head.Model == "" {
		WriteError(w, structs.Errf(structs.CodeInvalidRequest, "the request names no model"))
		return
	}
	route := rt.cfg.Lifecycle.Routes().Lookup(head.Model)
	if route == nil {
		WriteError(w, structs.Errf(structs.CodeUnknownModel, "no model %q", head.Model))
		return
	}
	if route.API != api {
		path := "/v1/chat/completions"
		if route.API == structs.APIDecisions {
			path = "/v1/systemone"
		}
		WriteError(w, structs.Errf(structs.CodeAPIMismatch, "model %q serves the %s API: send it to %s", head.Model, route.API, path))
		return
	}
	deadline := rt.cfg.DefaultDeadline
	if route.Spec != nil && route.Spec.RequestDeadline > 0 {
		deadline = route.Spec.RequestDeadline.D()
	}
	ctx := r.Context()
	target := pickTarget(route)
	if target == nil {
		actx, cancel := context.WithTimeout(ctx, deadline)
		err := rt.cfg.Lifecycle.Activate(actx, route.Deployment)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return // the client hung up while waiting
			}
			if errors.Is(err, context.DeadlineExceeded) {
				err = structs.Errf(structs.CodeUnavailable, "model %q did not become ready within %s", head.Model, deadline)
			}
			WriteError(w, err)
			return
		}
		route = rt.cfg.Lifecycle.Routes().Lookup(head.Model)
		if route != nil {
			target = pickTarget(route)
		}
		if target == nil {
			WriteError(w, structs.Errf(structs.CodeUnavailable, "model %q has no ready instance", head.Model))
			return
		}
	}
	pl := rt.placesFor(route)
	select {
	case pl.sem <- struct{}{}:
		defer func() { <-pl.sem }()
	case <-ctx.Done():
		return
	}
	rt.forward(w, r, route, target, body, head, reqID)
}

// pickTarget chooses a ready instance (round robin arrives with admission).
func pickTarget(route *lifecycle.Route) *lifecycle.Target {
	if len(route.Ready) == 0 {
		return nil
	}
	return route.Ready[int(time.Now().UnixNano()/1000)%len(route.Ready)]
}

func (rt *Router) placesFor(route *lifecycle.Route) *places {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	p, ok := rt.places[route.Deployment]
	if !ok {
		n := 32
		if route.Spec != nil && route.Spec.EngineConfig.MaxConcurrentRequests > 0 {
			n = route.Spec.EngineConfig.MaxConcurrentRequests
		}
		p = &places{sem: make(chan struct{}, n*max(route.Instances, 1))}
		rt.places[route.Deployment] = p
	}
	return p
}

// forward sends the request to the engine and relays the answer.
func (rt *Router) forward(w http.ResponseWriter, r *http.Request, route *lifecycle.Route, t *lifecycle.Target, body []byte, head requestHead, reqID string) {
	ep := t.Endpoint
	if ep.ServedName != "" && head.Model != ep.ServedName {
		body = rewriteModel(body, ep.ServedName)
	}
	path := ep.ChatPath
	if route.API == structs.APIDecisions {
		path = ep.DecisionsPath
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, ep.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		WriteError(w, structs.Wrap(structs.CodeInternal, err, "build engine request"))
		return
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	if head.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if ep.AuthHeader != "" {
		req.Header.Set(ep.AuthHeader, ep.AuthValue)
	}
	if ep.RequestIDHeader != "" {
		req.Header.Set(ep.RequestIDHeader, reqID)
	}
	resp, err := rt.client.Do(req)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		WriteError(w, structs.Wrap(structs.CodeUnavailable, err, "engine of %s did not answer", route.Deployment))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		code := structs.CodeEngineError
		if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity || resp.StatusCode == http.StatusRequestEntityTooLarge {
			code = structs.CodeEngineRejected
		}
		WriteError(w, structs.Errf(code, "%s", engineMessage(msg, resp.StatusCode)))
		return
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr != nil {
			return
		}
	}
}

// engineMessage extracts the engine's own error message.
func engineMessage(body []byte, status int) string {
	var env struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil {
		if len(env.Error) > 0 {
			var inner struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(env.Error, &inner) == nil && inner.Message != "" {
				return inner.Message
			}
			var s string
			if json.Unmarshal(env.Error, &s) == nil && s != "" {
				return s
			}
		}
		if env.Message != "" {
			return env.Message
		}
	}
	if len(body) > 0 {
		return string(bytes.TrimSpace(body))
	}
	return "the engine answered HTTP " + strconv.Itoa(status)
}

// rewriteModel replaces the body's model with the engine's served name.
func rewriteModel(body []byte, served string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	b, _ := json.Marshal(served)
	m["model"] = b
	out, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return out
}
