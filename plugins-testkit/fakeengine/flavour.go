// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Flavour makes the engine look like one engine family on the wire: which
// routes exist, the shapes of answers and error envelopes, metric names,
// authentication, readiness and exit behaviour. The engine drives the
// behaviour that all engines share (the loading phase, the slot queue,
// token generation, cancellation, failure knobs, simulated memory) and asks
// the flavour only how to say it.
//
// A flavour that differs from OpenAI in a few places embeds OpenAI and
// overrides those methods: the engine always calls through the interface,
// so an override is seen everywhere the engine uses it. Routes is the
// exception: a flavour lists its own routes, reusing the engine's handlers
// (Engine.ChatHandler, Engine.StatsHandler) and the exported helpers.
type Flavour interface {
	// Name is the flavour's name ("openai", later "vllm", "sglang", …).
	Name() string
	// Routes lists the flavour's routes. The engine adds GET /fake/stats
	// when the flavour does not list it, and answers other paths with
	// WriteError(KindRouteNotFound).
	Routes(e *Engine) []Route
	// Middleware wraps every route: authentication (see APIKeyMiddleware)
	// and any gate the engine family applies before routing.
	Middleware(e *Engine, next http.Handler) http.Handler
	// AcceptWhileLoading reports whether the engine answers HTTP during its
	// startup. When false the port is bound at once but no connection is
	// accepted until the engine is ready (vLLM and SGLang load before their
	// HTTP server runs).
	AcceptWhileLoading() bool
	// SignalExitCode is the exit status after a graceful shutdown on
	// SIGTERM (0 for most engines, 134 for llama-server).
	SignalExitCode() int
	// FormatLog renders one log line, without the newline.
	FormatLog(t time.Time, level Level, msg string) string
	// WriteError writes an error answer of the given kind in the family's
	// envelope and with the family's status code for it.
	WriteError(w http.ResponseWriter, kind ErrorKind, msg string)
	// PrepareChat checks a decoded chat request against the served model
	// and the family's rules, and sets its ID and ResponseModel. A refusal
	// is an *APIError.
	PrepareChat(e *Engine, r *http.Request, req *ChatRequest) error
	// ChatResponse is the JSON body of a finished non-streamed chat answer.
	ChatResponse(res *ChatResult) any
	// ChatStream encodes one streamed chat answer.
	ChatStream(req *ChatRequest, meta ChatMeta) ChatStream
}

// ChatStream encodes the events of one streamed chat answer. The engine
// writes what each method returns as is and flushes after every call.
type ChatStream interface {
	// Open returns the bytes sent before the first token (a role chunk),
	// or nil.
	Open() []byte
	// Token returns the event carrying one piece of content.
	Token(text string) []byte
	// Close returns the events after the last token: the chunk with the
	// finish reason, a usage chunk, the terminator.
	Close(res *ChatResult) []byte
}

// Route is one HTTP route of a flavour.
type Route struct {
	// Pattern is an http.ServeMux pattern ("GET /health").
	Pattern string
	// Handler answers it.
	Handler http.Handler
}

// ErrorKind is what went wrong, independent of how a family words it.
type ErrorKind int

// Error kinds a flavour must be able to write.
const (
	// KindInvalidJSON is a body that is not JSON.
	KindInvalidJSON ErrorKind = iota + 1
	// KindInvalidRequest is JSON that is not a valid request.
	KindInvalidRequest
	// KindModelNotFound is a model name the engine does not serve.
	KindModelNotFound
	// KindUnauthorized is a missing or wrong API key.
	KindUnauthorized
	// KindLoading is a request during startup.
	KindLoading
	// KindEngineFailure is an internal engine error (the fail-requests knob).
	KindEngineFailure
	// KindRouteNotFound is a path the engine does not serve.
	KindRouteNotFound
	// KindNotSupported is a route the engine has but was not enabled.
	KindNotSupported
)

// String names the kind.
func (k ErrorKind) String() string {
	switch k {
	case KindInvalidJSON:
		return "invalid_json"
	case KindInvalidRequest:
		return "invalid_request"
	case KindModelNotFound:
		return "model_not_found"
	case KindUnauthorized:
		return "unauthorized"
	case KindLoading:
		return "loading"
	case KindEngineFailure:
		return "engine_failure"
	case KindRouteNotFound:
		return "route_not_found"
	case KindNotSupported:
		return "not_supported"
	}
	return fmt.Sprintf("error_kind_%d", int(k))
}

// APIError is a refusal that a flavour writes with WriteError.
type APIError struct {
	// Kind is what went wrong.
	Kind ErrorKind
	// Message is the human-readable text.
	Message string
}

// Error implements error.
func (e *APIError) Error() string { return e.Kind.String() + ": " + e.Message }

// Level is a log line's severity.
type Level int

// Log levels.
const (
	// LevelInfo is routine progress; it goes to stdout.
	LevelInfo Level = iota
	// LevelWarn is a surprise; it goes to stderr.
	LevelWarn
	// LevelError is a failure; it goes to stderr.
	LevelError
)

// String is the level's upper-case name.
func (l Level) String() string {
	switch l {
	case LevelWarn:
		return "WARNING"
	case LevelError:
		return "ERROR"
	}
	return "INFO"
}

var (
	flavoursMu sync.RWMutex
	flavours   = map[string]func() Flavour{
		"openai": func() Flavour { return OpenAI{} },
	}
)

// RegisterFlavour makes a flavour available to FlavourByName (and so to
// the binary's --flavour). Registering a name twice panics.
func RegisterFlavour(name string, newFlavour func() Flavour) {
	flavoursMu.Lock()
	defer flavoursMu.Unlock()
	if _, ok := flavours[name]; ok {
		panic("fakeengine: flavour " + name + " registered twice")
	}
	flavours[name] = newFlavour
}

// FlavourByName returns a new flavour of that name.
func FlavourByName(name string) (Flavour, error) {
	flavoursMu.RLock()
	defer flavoursMu.RUnlock()
	if newFlavour, ok := flavours[name]; ok {
		return newFlavour(), nil
	}
	return nil, fmt.Errorf("unknown flavour %q (known: %s)", name, strings.Join(flavourNames(), ", "))
}

// FlavourNames lists the registered flavours, sorted.
func FlavourNames() []string {
	flavoursMu.RLock()
	defer flavoursMu.RUnlock()
	return flavourNames()
}

// flavourNames lists the flavours; the caller holds flavoursMu.
func flavourNames() []string {
	names := make([]string, 0, len(flavours))
	for n := range flavours {
		names = append(names, n)
	}
	sort.Strings(names)
	return slices.Clip(names)
}
