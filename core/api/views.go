// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// LoadResponse answers GET /management/v1/metrics/load.
type LoadResponse struct {
	APIVersion  string                  `json:"api_version"`
	At          time.Time               `json:"at"`
	Deployments []router.DeploymentLoad `json:"deployments"`
}

// LatencyResponse answers GET /management/v1/metrics/latency.
type LatencyResponse struct {
	APIVersion  string                     `json:"api_version"`
	At          time.Time                  `json:"at"`
	Deployments []router.DeploymentLatency `json:"deployments"`
}

// LoadView serves the load view: per deployment, the router's counts
// (in flight, waiting, places, cut requests waiting to settle, per
// instance) and each ready engine's idle signal and load figures, read
// through its driver off the hot path.
func LoadView(b *Backend) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if b.Router == nil {
			noRouter(w, r)
			return
		}
		writeJSON(w, http.StatusOK, LoadResponse{
			APIVersion: wire.APIVersion, At: time.Now().UTC(), Deployments: nonNil(b.Router.Load(r.Context())),
		})
	}
}

// LatencyView serves the latency view: per deployment, the queue wait,
// activation wait, engine first byte, time to first content and total time
// of the last 1024 completed requests (count, p50, p90, p99, mean, max in
// milliseconds).
func LatencyView(b *Backend) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if b.Router == nil {
			noRouter(w, r)
			return
		}
		writeJSON(w, http.StatusOK, LatencyResponse{
			APIVersion: wire.APIVersion, At: time.Now().UTC(), Deployments: nonNil(b.Router.Latency()),
		})
	}
}

// MetricsView serves the core's Prometheus metrics (text exposition
// format); mount it on the management listener, behind the admin token.
func MetricsView(b *Backend) http.Handler {
	if b.Router == nil {
		return http.HandlerFunc(noRouter)
	}
	return b.Router.MetricsHandler()
}

// noRouter answers the views of a role that routes no requests.
func noRouter(w http.ResponseWriter, r *http.Request) {
	writeMgmtError(w, structs.Errf(structs.CodeUnsupported, "this role routes no inference requests"))
}

// RequestExtras returns a DeploymentExtras function that adds the router's
// request counts to a deployment's status: requests.in_flight, waiting,
// places, settle_when_idle, settle_at_stop, settle_on_abort.
func RequestExtras(rt *router.Router) func(st *wire.DeploymentStatus) {
	return func(st *wire.DeploymentStatus) {
		if req := rt.DeploymentRequests(st.Name); req != nil {
			st.Requests = req
		} else {
			st.Requests = map[string]any{"in_flight": 0, "waiting": 0, "settle_when_idle": 0, "settle_at_stop": 0, "settle_on_abort": 0}
		}
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
