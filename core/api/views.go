// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

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
		writeJSON(w, http.StatusOK, wire.LoadResponse{
			APIVersion: wire.APIVersion, At: time.Now().UTC(), Deployments: loadViews(b.Router.Load(r.Context())),
		})
	}
}

// loadViews builds the wire form of the router's load view ([] when no
// deployment).
func loadViews(loads []router.DeploymentLoad) []wire.DeploymentLoad {
	out := make([]wire.DeploymentLoad, 0, len(loads))
	for _, dl := range loads {
		c := dl.Requests
		v := wire.DeploymentLoad{Deployment: dl.Deployment, Requests: wire.RequestCounts{
			Places: c.Places, MaxWaiting: c.MaxWaiting, Waiting: c.Waiting, InFlight: c.Live,
			SettleWhenIdle: c.SettleWhenIdle, SettleAtStop: c.SettleAtStop, SettleOnAbort: c.SettleOnAbort, Turn: c.Turn,
		}}
		if c.Instances != nil {
			v.Requests.Instances = make([]wire.InstanceRequestCounts, 0, len(c.Instances))
			for _, ic := range c.Instances {
				v.Requests.Instances = append(v.Requests.Instances, wire.InstanceRequestCounts{
					ID: ic.ID, Generation: ic.Generation, Ready: ic.Ready, InFlight: ic.Live,
					SettleWhenIdle: ic.SettleWhenIdle, SettleAtStop: ic.SettleAtStop, SettleOnAbort: ic.SettleOnAbort,
				})
			}
		}
		if dl.Engines != nil {
			v.Engines = make(map[string]wire.EngineLoad, len(dl.Engines))
			for id, l := range dl.Engines {
				v.Engines[id] = wire.EngineLoad{Known: l.Known, Running: l.Running, Waiting: l.Waiting, KVUsage: l.KVUsage, Figures: l.Figures, At: l.At}
			}
		}
		out = append(out, v)
	}
	return out
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
	if b.Usage == nil {
		return b.Router.MetricsHandler()
	}
	// The keys' series (capyctl_key_*) beside the router's.
	reg := prometheus.NewRegistry()
	reg.MustRegister(b.Usage)
	return promhttp.HandlerFor(prometheus.Gatherers{b.Router.Gatherer(), reg}, promhttp.HandlerOpts{})
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

var (
	descStartSlots = prometheus.NewDesc("capyctl_start_slots_in_use",
		"Start slots in use, by driver family: one per start under way (bounded by max_concurrent_effects per family); 0 when no start runs.", []string{"family"}, nil)
	descPortLeases = prometheus.NewDesc("capyctl_engine_port_leases",
		"Loopback ports leased to engines and LMCache servers: one per engine and per LMCache server that runs or is kept at a park.", nil, nil)
)

// heldCollector reads what the lifecycle holds at scrape time.
type heldCollector struct{ lc *lifecycle.Manager }

// HeldCollector returns the metrics of what the lifecycle holds (start
// slots by family, engine port leases), for router.Config.Collectors: a
// quiet role shows no slot in use and one lease per running engine.
func HeldCollector(lc *lifecycle.Manager) prometheus.Collector { return heldCollector{lc: lc} }

func (c heldCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descStartSlots
	ch <- descPortLeases
}

func (c heldCollector) Collect(ch chan<- prometheus.Metric) {
	h := c.lc.Held()
	for family, n := range h.StartSlots {
		ch <- prometheus.MustNewConstMetric(descStartSlots, prometheus.GaugeValue, float64(n), family)
	}
	ch <- prometheus.MustNewConstMetric(descPortLeases, prometheus.GaugeValue, float64(h.PortLeases))
}

// Bounds of the requests view's page.
const (
	defaultRequestsPage = 50
	maxRequestsPage     = 500
)

// RequestsView serves the request log's newest records (?deployment=,
// ?limit=): what the dashboard lists, each with its route.
func RequestsView(b *Backend) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		limit := defaultRequestsPage
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxRequestsPage {
				writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest, "limit must be 1 to %d", maxRequestsPage))
				return
			}
			limit = n
		}
		out := wire.RequestsResponse{APIVersion: wire.APIVersion, At: time.Now().UTC(), Requests: []wire.RequestRecord{}}
		if b.Store != nil {
			recs, err := b.Store.ListRequests(r.URL.Query().Get("deployment"), limit)
			if err != nil {
				writeMgmtError(w, err)
				return
			}
			for _, rec := range recs {
				out.Requests = append(out.Requests, wire.RequestRecord{
					ID: rec.ID, Deployment: rec.Deployment, Instance: rec.Instance, Route: rec.API, Stream: rec.Stream,
					Outcome: rec.Outcome, Code: rec.Code, Status: rec.Status, ReceivedAt: rec.ReceivedAt,
					QueueMs: rec.QueueMs, ActivationMs: rec.ActivationMs, TTFBMs: rec.TTFBMs, TotalMs: rec.TotalMs,
					PromptTokens: rec.PromptTokens, CompletionToks: rec.CompletionToks, Key: rec.Key,
				})
			}
		}
		writeJSON(w, http.StatusOK, out)
	}
}
