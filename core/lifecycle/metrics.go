// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import "github.com/prometheus/client_golang/prometheus"

// The switching figures as Prometheus metrics, read at scrape time from
// SwitchStats (nothing is counted twice; the router's registry serves them
// beside its own, core/agent registers them).
var (
	descSwitches = prometheus.NewDesc("capyctl_switches_total",
		"Switches completed: a model brought into memory by evicting others.", nil, nil)
	descSwitchesFailed = prometheus.NewDesc("capyctl_switches_failed_total",
		"Switches whose incoming model did not become ready.", nil, nil)
	descSwitchesMinute = prometheus.NewDesc("capyctl_switches_last_minute",
		"Switches completed in the last minute.", nil, nil)
	descSwapSeconds = prometheus.NewDesc("capyctl_switch_swap_seconds_total",
		"Wall time the card spent switching: the victims' parks and stops and the incoming models' wakes and starts.", nil, nil)
	descTurns = prometheus.NewDesc("capyctl_turns_ended_total",
		"Turns a model ended because another model waited for its memory, by deployment.",
		[]string{"deployment"}, nil)
	descTurnReasons = prometheus.NewDesc("capyctl_turns_ended_by_reason_total",
		"Turns ended because another model waited, by why they ended (idle, budget_requests, budget_time).", []string{"reason"}, nil)
	descSwitchWaits = prometheus.NewDesc("capyctl_switch_waits_total",
		"Switches a deployment waited for (from joining the switch queue until its room was made).", []string{"deployment"}, nil)
	descSwitchWaitSeconds = prometheus.NewDesc("capyctl_switch_wait_seconds_total",
		"Time a deployment waited for its switches, all together.", []string{"deployment"}, nil)
	descSwitchQueue = prometheus.NewDesc("capyctl_switch_queue_length",
		"Models waiting for a switch to bring them into memory, the one making room included.", nil, nil)
)

// SwitchCollector exports a manager's switching figures.
type SwitchCollector struct{ M *Manager }

// Describe implements prometheus.Collector.
func (c SwitchCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSwitches, descSwitchesFailed, descSwitchesMinute, descSwapSeconds,
		descTurns, descTurnReasons, descSwitchWaits, descSwitchWaitSeconds, descSwitchQueue} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c SwitchCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.M.SwitchStats()
	ch <- prometheus.MustNewConstMetric(descSwitches, prometheus.CounterValue, float64(s.Switches))
	ch <- prometheus.MustNewConstMetric(descSwitchesFailed, prometheus.CounterValue, float64(s.Failed))
	ch <- prometheus.MustNewConstMetric(descSwitchesMinute, prometheus.GaugeValue, float64(s.LastMinute))
	ch <- prometheus.MustNewConstMetric(descSwapSeconds, prometheus.CounterValue, s.SwapSeconds)
	for dep, n := range s.Turns {
		ch <- prometheus.MustNewConstMetric(descTurns, prometheus.CounterValue, float64(n), dep)
	}
	for why, n := range s.TurnReasons {
		ch <- prometheus.MustNewConstMetric(descTurnReasons, prometheus.CounterValue, float64(n), why)
	}
	for dep, w := range s.Waits {
		ch <- prometheus.MustNewConstMetric(descSwitchWaits, prometheus.CounterValue, float64(w.Count), dep)
		ch <- prometheus.MustNewConstMetric(descSwitchWaitSeconds, prometheus.CounterValue, w.Seconds, dep)
	}
	ch <- prometheus.MustNewConstMetric(descSwitchQueue, prometheus.GaugeValue, float64(len(s.Queue)))
}
