// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginefacts"
)

// KVUsageUnknown is a LoadResponse's kv_usage when the engine reports none
// (the protocol's "-1 when unknown").
const KVUsageUnknown = -1

// MetricNames are a family's Prometheus names for the idle signal.
type MetricNames struct {
	// Running and Waiting are the request gauges.
	Running, Waiting string
	// KVUsage are the KV usage gauges (0..1), the first found wins.
	KVUsage []string
	// Figures are further samples reported by name (counters, gauges).
	Figures []string
}

// MetricNamesOf returns the names of an engine table's metrics.
func MetricNamesOf(m enginefacts.Metrics) MetricNames {
	return MetricNames{Running: m.Running.Value, Waiting: m.Waiting.Value,
		KVUsage: enginefacts.Values(m.KVUsage), Figures: enginefacts.Values(m.Figures)}
}

// ReadLoad reads the idle signal from GET /metrics: running and waiting
// requests of the served model (the samples labelled model_name, or all of
// them when the engine does not label), the KV usage and the figures.
// known is false when the engine does not answer or lacks the gauges.
func ReadLoad(ctx context.Context, c *engineapi.EngineClient, served string, names MetricNames) *sdk.LoadResponse {
	unknown := &sdk.LoadResponse{Known: false, KVUsage: KVUsageUnknown}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "/metrics")
	if err != nil {
		return unknown
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return unknown
	}
	ms, err := engineapi.ParseMetrics(resp.Body)
	if err != nil {
		return unknown
	}
	value := func(name string) (float64, bool) {
		if v, ok := ms.SumMatching(name, map[string]string{"model_name": served}); ok {
			return v, true
		}
		return ms.Sum(name)
	}
	running, ok := value(names.Running)
	if !ok {
		return unknown
	}
	out := &sdk.LoadResponse{Known: true, Running: int64(running), KVUsage: KVUsageUnknown, Figures: map[string]float64{}}
	if w, ok := value(names.Waiting); ok {
		out.Waiting = int64(w)
	}
	for _, n := range names.KVUsage {
		if v, ok := value(n); ok {
			out.KVUsage = v
			break
		}
	}
	for _, n := range names.Figures {
		if v, ok := value(n); ok {
			out.Figures[n] = v
		}
	}
	return out
}

// Idle reports whether the engine reads idle (nothing running or waiting);
// false when the signal is unknown.
func Idle(l *sdk.LoadResponse) bool {
	return l != nil && l.Known && l.Running == 0 && l.Waiting == 0
}

// CheckIdle refuses to park an instance that is not idle (or whose idle
// signal is unknown): the core drains it first.
func CheckIdle(ctx context.Context, in *Instance, names MetricNames) error {
	if load := ReadLoad(ctx, in.Client, in.ServedName, names); !Idle(load) {
		return sdk.Errorf(sdk.CodeNotIdle, "instance %s is not idle (running %d, waiting %d, known %v): drain it before parking",
			in.ID, load.Running, load.Waiting, load.Known)
	}
	return nil
}
