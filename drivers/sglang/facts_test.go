// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sglang

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
	if want := enginekit.MetricNamesOf(enginefacts.SGLang.Metrics); !reflect.DeepEqual(metricNames, want) {
		t.Errorf("metric names %+v, the table has %+v", metricNames, want)
	}
	if got, want := publicRoutes, enginefacts.Values(enginefacts.SGLang.OpenRoutes); !reflect.DeepEqual(got, want) {
		t.Errorf("open routes %v, the table has %v", got, want)
	}
}
