// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package api serves CapyCTL's two HTTP surfaces on gorilla/mux: the
// OpenAI-compatible inference API (API key) and the management API
// (loopback, admin token). Handlers decide nothing about lifecycles; they
// translate HTTP to calls on the lifecycle, the engine registry and the
// router, and errors to one envelope with stable codes.
package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api/dashboard"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/engines"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/usage"
)

// Backend is what the handlers call.
type Backend struct {
	Lifecycle *lifecycle.Manager
	Store     *store.Store
	Engines   *engines.Registry
	Router    *router.Router
	Logger    hclog.Logger
	// Role describes the running role for the snapshot.
	Role wire.RoleInfo
	// Hosts lists the machines that run engines (standalone: itself).
	Hosts func() []wire.Host
	// Fleet is the server role's joined hosts (nil: a standalone role).
	Fleet Fleet
	// Override replaces the handler of a management route, keyed "METHOD
	// path" as in ManagementRoutes ("GET /deployments"): the server role
	// answers the routes that need a lifecycle from its hosts.
	Override map[string]http.HandlerFunc
	// Servers is the server role's cluster of servers (nil: none).
	Servers Servers
	// Forward wraps every mutating route (the server role sends a
	// follower's mutations to the leader); nil: none.
	Forward func(http.HandlerFunc) http.HandlerFunc
	// DeploymentExtras adds ledger and request figures to a status.
	DeploymentExtras func(st *wire.DeploymentStatus)
	// Config returns the role's effective settings with their sources for
	// GET /config; nil answers unsupported.
	Config func() *wire.RoleConfig
	// RequestLedger describes the request ledger's writer for the
	// snapshot; nil leaves it out.
	RequestLedger func() *wire.RequestLedgerStatus
	// Inference is the role's inference API handler (key check
	// included): the dashboard's playground hands its requests to it;
	// nil leaves the playground out. InferenceKeys are the keys the
	// playground may use by name.
	Inference     http.Handler
	InferenceKeys func() []dashboard.Key
	// Responses are the Responses API's stored responses (nil: none
	// kept).
	Responses *responses.Store
	// Keys are the inference API's named keys (nil: the routes answer
	// unsupported).
	Keys *apikeys.Keeper
	// Usage counts the keys' usage (nil: GET /usage answers unsupported).
	Usage *usage.Meter
	// PeerUsage returns the other servers' usage rows for the request's
	// query, the servers counted and those that did not answer (a cluster
	// of servers; nil: none).
	PeerUsage func(r *http.Request) (rows []wire.UsageRow, servers, missing []string)
	// PeerKeyUses returns when the other servers first and last
	// authenticated each key, by name (nil: none).
	PeerKeyUses func(r *http.Request) map[string][2]time.Time

	keys    keyLocks
	streams streamSlots
}

// logger returns the backend's logger, or a null one.
func (b *Backend) logger() hclog.Logger {
	if b.Logger == nil {
		return hclog.NewNullLogger()
	}
	return b.Logger
}

// tokenEqual compares secrets in constant time (over fixed-size digests, so
// the length does not leak either).
func tokenEqual(got, want string) bool {
	if want == "" {
		return false
	}
	a := sha256.Sum256([]byte(got))
	b := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// bearer extracts a bearer token; the scheme is case-insensitive.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// writeJSON writes a JSON answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteManagementError writes the management API's error envelope (with
// Retry-After for a retryable 429 or 503): the server role's answers from
// its hosts use it too.
func WriteManagementError(w http.ResponseWriter, err error) { writeMgmtError(w, err) }

// WriteJSON writes a JSON answer with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

// writeMgmtError writes the management error envelope.
func writeMgmtError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	info := e.Info()
	status := wire.HTTPStatus(e.Code)
	if info.Retryable && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, wire.ErrorEnvelope{
		APIVersion: wire.APIVersion,
		Error:      wire.ErrorBody{Code: string(e.Code), Message: e.Message, Retryable: info.Retryable, Details: e.Details},
	})
}
