// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/capyctl/capyctl/core/api/wire"
)

// metrics are the server's own series: its process, its hosts by state and
// the requests it relays now.
func (s *Server) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	hosts := prometheus.NewDesc("capyctl_hosts", "Joined hosts by state (ready, draining, lost).", []string{"state"}, nil)
	inFlight := prometheus.NewDesc("capyctl_relay_requests_in_flight", "Requests the server relays to a host now.", []string{"host"}, nil)
	refused := prometheus.NewDesc("capyctl_host_messages_refused_total",
		"Messages of a host's link this server refused, by reason (over a bound, or not the host's to say: linkbounds.go).", []string{"host", "reason"}, nil)
	reg.MustRegister(collectorFunc{descs: []*prometheus.Desc{hosts, inFlight, refused}, collect: func(ch chan<- prometheus.Metric) {
		count := map[string]int{wire.HostReady: 0, wire.HostDraining: 0, wire.HostLost: 0}
		for _, h := range s.Hosts() {
			count[h.State]++
		}
		for st, n := range count {
			ch <- prometheus.MustNewConstMetric(hosts, prometheus.GaugeValue, float64(n), st)
		}
		s.mu.Lock()
		guards := map[string]*hostGuard{}
		for name, h := range s.hosts {
			ch <- prometheus.MustNewConstMetric(inFlight, prometheus.GaugeValue, float64(h.inFlight), name)
			if h.guard != nil {
				guards[name] = h.guard
			}
		}
		s.mu.Unlock()
		for name, g := range guards {
			counts := g.counts()
			for _, reason := range hostRefusalReasons {
				if n := counts[reason]; n > 0 {
					ch <- prometheus.MustNewConstMetric(refused, prometheus.CounterValue, float64(n), name, reason)
				}
			}
		}
	}})
	for _, c := range s.o.Collectors {
		reg.MustRegister(c)
	}
	// Uncompressed: the hosts' series are appended as text after these.
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{DisableCompression: true})
}

// collectorFunc is a prometheus.Collector of a function.
type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
