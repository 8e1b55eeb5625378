// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
)

// latencySeries are the series of the latency view, in order.
var latencySeries = []string{"queue_wait", "activation_wait", "upstream_first_byte", "time_to_first_content", "total"}

// ringSize is how many completed requests each latency series keeps.
const ringSize = 1024

// stats holds the router's Prometheus metrics and the latency samples of
// the management API's latency view.
type stats struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	refusals   *prometheus.CounterVec
	queueWait  *prometheus.HistogramVec
	activation *prometheus.HistogramVec
	ttfb       *prometheus.HistogramVec
	total      *prometheus.HistogramVec

	mu   sync.Mutex
	deps map[string]*depMetrics
}

// depMetrics are one deployment's metric handles (looked up once, not per
// request) and latency rings.
type depMetrics struct {
	queueWait, activation, ttfb, total prometheus.Observer

	mu     sync.Mutex
	series map[string]*ring
}

type ring struct {
	v []float64
	n int
}

func (r *ring) add(x float64) {
	if len(r.v) < ringSize {
		r.v = append(r.v, x)
	} else {
		r.v[r.n%ringSize] = x
	}
	r.n++
}

func newStats() *stats {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	h := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "capyctl", Name: name, Help: help, Buckets: buckets}, []string{"deployment"})
	}
	s := &stats{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capyctl", Name: "requests_total", Help: "Inference requests by deployment, API and outcome.",
		}, []string{"deployment", "api", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "capyctl", Name: "refusals_total", Help: "Inference requests refused, by deployment and error code (queue_full, insufficient_resources, capacity_blocked, unavailable, ...).",
		}, []string{"deployment", "code"}),
		queueWait:  h("request_queue_wait_seconds", "Time from arrival to a running place, activation excluded."),
		activation: h("request_activation_wait_seconds", "Time a request waited for its model to start or wake."),
		ttfb:       h("request_time_to_first_byte_seconds", "Time from arrival to the engine's first output."),
		total:      h("request_duration_seconds", "Time from arrival to the end of the answer."),
		deps:       map[string]*depMetrics{},
	}
	s.reg.MustRegister(s.requests, s.refusals, s.queueWait, s.activation, s.ttfb, s.total,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s
}

func (s *stats) deployment(name string) *depMetrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.deps[name]; ok {
		return m
	}
	m := &depMetrics{
		queueWait: s.queueWait.WithLabelValues(name), activation: s.activation.WithLabelValues(name),
		ttfb: s.ttfb.WithLabelValues(name), total: s.total.WithLabelValues(name),
		series: map[string]*ring{},
	}
	for _, k := range latencySeries {
		m.series[k] = &ring{}
	}
	s.deps[name] = m
	return m
}

// count counts a finished request of dep (m: the metrics it was served
// with, nil when it was not routed) and its refusal code, if any. A
// request that ends after its deleted deployment was forgotten (its place
// is given back before its answer is recorded, and settleOnce may forget
// the deployment in between) is not counted: its series would come back
// and stay for good. s.mu is held across the check and the count, so a
// forget (which drops the deployment under s.mu before its series) comes
// wholly before or after.
func (s *stats) count(dep string, m *depMetrics, api, outcome, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m != nil && s.deps[dep] != m {
		return
	}
	s.requests.WithLabelValues(dep, api, outcome).Inc()
	if code != "" {
		s.refusals.WithLabelValues(dep, code).Inc()
	}
}

// record counts a finished request and writes its ledger record; it runs
// after the answer reached the client.
func (rt *Router) record(q *request) {
	dep := ""
	if q.route != nil {
		dep = q.route.Deployment
	}
	api := q.api
	if q.dl != nil {
		api = q.dl.kind() // dialect: the route it came in
	}
	var m *depMetrics
	if q.ds != nil {
		m = q.ds.m
	}
	code := ""
	if q.outcome == OutcomeRefused {
		code = q.code
	}
	rt.stats.count(dep, m, api, q.outcome, code)
	sec := func(d time.Duration) float64 { return d.Seconds() }
	if q.ds != nil {
		m := q.ds.m
		if !q.granted.IsZero() {
			m.queueWait.Observe(sec(q.granted.Sub(q.start) - q.activation))
		}
		if q.activated {
			m.activation.Observe(sec(q.activation))
		}
		if !q.firstContent.IsZero() {
			m.ttfb.Observe(sec(q.firstContent.Sub(q.start)))
		}
		m.total.Observe(sec(q.endAt.Sub(q.start)))
		if q.outcome == OutcomeCompleted {
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			m.mu.Lock()
			if !q.granted.IsZero() {
				m.series["queue_wait"].add(ms(q.granted.Sub(q.start) - q.activation))
			}
			if q.activated {
				m.series["activation_wait"].add(ms(q.activation))
			}
			if !q.headAt.IsZero() {
				m.series["upstream_first_byte"].add(ms(q.headAt.Sub(q.forwardAt)))
			}
			if !q.firstContent.IsZero() {
				m.series["time_to_first_content"].add(ms(q.firstContent.Sub(q.start)))
			}
			m.series["total"].add(ms(q.endAt.Sub(q.start)))
			m.mu.Unlock()
		}
	}
	if rt.cfg.RequestLog == nil {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	rec := structs.RequestRecord{
		ID: q.id, Deployment: dep, API: api, Stream: q.stream,
		Outcome: q.outcome, Code: q.code, Status: q.status, ReceivedAt: q.start.UTC(),
		TotalMs: ms(q.endAt.Sub(q.start)), BytesIn: int64(q.bodyN), BytesOut: q.bytesOut, Key: q.caller.Key,
	}
	// IMPORTANT: the client's X-Request-Id is never stored (A5).
	if q.target != nil {
		rec.Instance = q.target.Instance
	}
	if !q.granted.IsZero() {
		rec.QueueMs = ms(q.granted.Sub(q.start) - q.activation)
	}
	if q.activated {
		rec.ActivationMs = ms(q.activation)
	}
	if !q.firstContent.IsZero() {
		rec.TTFBMs = ms(q.firstContent.Sub(q.start))
	}
	if q.usage.known {
		rec.PromptTokens, rec.CompletionToks = q.usage.prompt, q.usage.completion
	}
	rt.cfg.RequestLog.Record(rec)
}

// MetricsHandler serves the core's Prometheus metrics: requests by
// outcome, refusals by code, queue depth, in-flight and unsettled
// requests, latency histograms, what Register added (the lifecycle's
// switching), and the Go runtime's and process's own.
func (rt *Router) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(rt.stats.reg, promhttp.HandlerOpts{})
}

// Gatherer is the router's metrics registry, for a handler that serves
// them with other series (the keys' usage).
func (rt *Router) Gatherer() prometheus.Gatherer { return rt.stats.reg }

// Register adds a collector to the metrics the router serves (the agent
// adds the lifecycle's switching figures).
func (rt *Router) Register(c prometheus.Collector) error { return rt.stats.reg.Register(c) }

// gauges reads the admission counts at scrape time (nothing on the hot
// path).
type gauges struct{ rt *Router }

var (
	descInFlight = prometheus.NewDesc("capyctl_requests_in_flight", "Requests holding a running place and being served.", []string{"deployment"}, nil)
	descWaiting  = prometheus.NewDesc("capyctl_queue_depth", "Requests waiting for a running place or an activation.", []string{"deployment"}, nil)
	descUnsettle = prometheus.NewDesc("capyctl_requests_unsettled", "Cut requests still holding a place, by the evidence they wait for.", []string{"deployment", "settle"}, nil)
	descPlaces   = prometheus.NewDesc("capyctl_running_places", "Running places per instance.", []string{"deployment"}, nil)
	descWaitAll  = prometheus.NewDesc("capyctl_queue_waiting_bytes", "Bytes of waiting request bodies, all deployments.", nil, nil)
	descStale    = prometheus.NewDesc("capyctl_engine_connections_stale_total", "Pooled engine connections found closed by the engine (dropped before use, or a request sent again on a new connection).", nil, nil)
	descTaken    = prometheus.NewDesc("capyctl_streams_taken_over", "Open streams the router relays on client connections it took over from the HTTP server (see Memory per open stream).", nil, nil)
	// descLedgerDropped is read from the ledger at scrape time: the ledger
	// counts its drops itself, off the hot path.
	descLedgerDropped = prometheus.NewDesc("capyctl_request_ledger_dropped_total",
		"Request ledger records lost: the writer's queue was full, the writer closed, or their commit failed.", nil, nil)
)

// DroppingLog is a RequestLog that counts the records it lost
// (store.RequestWriter); the router exports the count.
type DroppingLog interface {
	RequestLog
	Dropped() uint64
}

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInFlight
	ch <- descWaiting
	ch <- descUnsettle
	ch <- descPlaces
	ch <- descWaitAll
	ch <- descStale
	ch <- descTaken
	ch <- descLedgerDropped
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	for _, d := range g.rt.adm.Deployments() {
		c := d.Counts()
		n := d.Name()
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(c.Live), n)
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(c.Waiting), n)
		ch <- prometheus.MustNewConstMetric(descPlaces, prometheus.GaugeValue, float64(c.Places), n)
		ch <- prometheus.MustNewConstMetric(descUnsettle, prometheus.GaugeValue, float64(c.SettleWhenIdle), n, "settle_when_idle")
		ch <- prometheus.MustNewConstMetric(descUnsettle, prometheus.GaugeValue, float64(c.SettleAtStop), n, "settle_at_stop")
		ch <- prometheus.MustNewConstMetric(descUnsettle, prometheus.GaugeValue, float64(c.SettleOnAbort), n, "settle_on_abort")
	}
	_, bytes := g.rt.adm.WaitingAll()
	ch <- prometheus.MustNewConstMetric(descWaitAll, prometheus.GaugeValue, float64(bytes))
	ch <- prometheus.MustNewConstMetric(descStale, prometheus.CounterValue, float64(g.rt.engine.stale.Load()))
	ch <- prometheus.MustNewConstMetric(descTaken, prometheus.GaugeValue, float64(g.rt.Open()))
	if l, ok := g.rt.cfg.RequestLog.(DroppingLog); ok {
		ch <- prometheus.MustNewConstMetric(descLedgerDropped, prometheus.CounterValue, float64(l.Dropped()))
	}
}

// Summary is one latency series of completed requests, in milliseconds.
type Summary struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Mean  float64 `json:"mean_ms"`
	Max   float64 `json:"max_ms"`
}

// DeploymentLatency is one deployment's latency series.
type DeploymentLatency struct {
	Deployment string `json:"deployment"`
	// Series maps queue_wait, activation_wait, upstream_first_byte,
	// time_to_first_content and total to their summaries (the last 1024
	// completed requests).
	Series map[string]Summary `json:"series"`
}

// Latency returns the latency view, sorted by deployment.
func (rt *Router) Latency() []DeploymentLatency {
	rt.stats.mu.Lock()
	names := make([]string, 0, len(rt.stats.deps))
	for n := range rt.stats.deps {
		names = append(names, n)
	}
	rt.stats.mu.Unlock()
	sort.Strings(names)
	out := make([]DeploymentLatency, 0, len(names))
	for _, n := range names {
		m := rt.stats.deployment(n)
		dl := DeploymentLatency{Deployment: n, Series: map[string]Summary{}}
		m.mu.Lock()
		for k, r := range m.series {
			if len(r.v) == 0 {
				continue
			}
			v := append([]float64(nil), r.v...)
			m.mu.Unlock()
			sort.Float64s(v)
			sum := 0.0
			for _, x := range v {
				sum += x
			}
			pct := func(p float64) float64 { return v[min(len(v)-1, int(p*float64(len(v))))] }
			dl.Series[k] = Summary{Count: r.n, P50: pct(.5), P90: pct(.9), P99: pct(.99), Mean: sum / float64(len(v)), Max: v[len(v)-1]}
			m.mu.Lock()
		}
		m.mu.Unlock()
		out = append(out, dl)
	}
	return out
}

// DeploymentLoad is one deployment's load: the router's counts and each
// instance's engine reading.
type DeploymentLoad struct {
	Deployment string           `json:"deployment"`
	Requests   admission.Counts `json:"requests"`
	// Engines maps an instance to its engine's idle signal and figures.
	Engines map[string]routes.InstanceLoad `json:"engines,omitempty"`
}

// Load returns the load view, reading each ready instance's engine (off
// the hot path), sorted by deployment.
func (rt *Router) Load(ctx context.Context) []DeploymentLoad {
	var out []DeploymentLoad
	for _, d := range rt.adm.Deployments() {
		dl := DeploymentLoad{Deployment: d.Name(), Requests: d.Counts()}
		if rt.req != nil {
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, ic := range dl.Requests.Instances {
				if !ic.Ready {
					continue
				}
				wg.Add(1)
				go func(id string) {
					defer wg.Done()
					lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					defer cancel()
					l, err := rt.req.Load(lctx, id)
					if err != nil {
						return
					}
					mu.Lock()
					if dl.Engines == nil {
						dl.Engines = map[string]routes.InstanceLoad{}
					}
					dl.Engines[id] = l
					mu.Unlock()
				}(ic.ID)
			}
			wg.Wait()
		}
		out = append(out, dl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Deployment < out[j].Deployment })
	return out
}

// DeploymentRequests returns a deployment's request counts for status
// (requests.settle_when_idle, requests.settle_at_stop, ...), nil when the
// router has seen no request for it.
func (rt *Router) DeploymentRequests(name string) map[string]any {
	d := rt.adm.Lookup(name)
	if d == nil {
		return nil
	}
	c := d.Counts()
	return map[string]any{
		"in_flight":        c.Live,
		"waiting":          c.Waiting,
		"places":           c.Places,
		"max_waiting":      c.MaxWaiting,
		"settle_when_idle": c.SettleWhenIdle,
		"settle_at_stop":   c.SettleAtStop,
		"settle_on_abort":  c.SettleOnAbort,
		"turn":             c.Turn,
	}
}
