// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"reflect"
	"testing"

	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// TestFacts_DriverReadsTheTable: the metric names the driver reads and
// the open routes its exposure report lists are the engine table's, which
// the fake engine is tested against (plugins-testkit/fakeengine), so the
// driver and its fake cannot disagree.
func TestFacts_DriverReadsTheTable(t *testing.T) {
	if want := enginekit.MetricNamesOf(enginefacts.VLLM.Metrics); !reflect.DeepEqual(metricNames, want) {
		t.Errorf("metric names %+v, the table has %+v", metricNames, want)
	}
	if got, want := openRoutes("k", true), append(enginefacts.Values(enginefacts.VLLM.OpenRoutes), enginefacts.Values(enginefacts.VLLM.ParkOpenRoutes)...); !reflect.DeepEqual(got, want) {
		t.Errorf("open routes %v, the table has %v", got, want)
	}
}
