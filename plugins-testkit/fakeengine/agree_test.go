// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/enginefacts"
)

// The drivers' tables (sdk/enginefacts) and the fakes' (facts.go) are
// kept apart on purpose; this test, and only this test, reads both. When
// they disagree it fails naming both sources, and the engines' own
// sources decide which table is wrong.

// TestFacts_EveryEngineHasAFake keeps factsFlavours complete.
func TestFacts_EveryEngineHasAFake(t *testing.T) {
	fl := factsFlavours()
	for _, e := range enginefacts.Engines() {
		if fl[e.Family] == nil || fakeengine.FactsFor(e.Family) == nil {
			t.Errorf("engine table %s has no fake (factsFlavours, fakeengine.FactsFor)", e.Family)
		}
	}
}

// TestFacts_DriversAgreeWithTheFakes compares what each driver reads with
// what its fake serves: the same request gauges; a KV usage gauge the
// driver knows, when the fake's engine serves one; every figure the
// driver reports served by the fake; every route the driver's exposure
// report calls open answered by the fake without the key, and every other
// route the fake serves refused without it.
func TestFacts_DriversAgreeWithTheFakes(t *testing.T) {
	for family, mk := range factsFlavours() {
		t.Run(family, func(t *testing.T) {
			d := enginefacts.Lookup(family)
			f := fakeengine.FactsFor(family)
			differ := func(what string, driver enginefacts.Fact, fake fakeengine.Fact) {
				t.Errorf("%s: the driver reads %q (%s), the fake serves %q (%s)", what, driver.Value, driver.Source, fake.Value, fake.Source)
			}
			if d.Metrics.Running.Value != f.Running.Value {
				differ("running gauge", d.Metrics.Running, f.Running)
			}
			if d.Metrics.Waiting.Value != f.Waiting.Value {
				differ("waiting gauge", d.Metrics.Waiting, f.Waiting)
			}
			if f.KVUsage.Value != "" && !slices.Contains(enginefacts.Values(d.Metrics.KVUsage), f.KVUsage.Value) {
				t.Errorf("KV usage: the fake serves %q (%s), which the driver's list %v does not read", f.KVUsage.Value, f.KVUsage.Source, enginefacts.Values(d.Metrics.KVUsage))
			}
			served := f.MetricNames()
			for _, fig := range d.Metrics.Figures {
				if !slices.Contains(served, fig.Value) {
					t.Errorf("figure %q: the driver reads it (%s), the fake's engine does not serve it", fig.Value, fig.Source)
				}
			}
			if g, fg := enginefacts.Values(d.GuardedPrefixes), fakeengine.Values(f.GuardedPrefixes); !slices.Equal(g, fg) {
				t.Errorf("guarded prefixes: the driver %v, the fake %v", g, fg)
			}

			fl := mk()
			te := startEngine(t, fakeengine.Config{ServedName: "m", APIKey: "k", Flavour: fl}, true)
			openRoutes := append(enginefacts.Values(d.OpenRoutes), enginefacts.Values(d.ParkOpenRoutes)...)
			for _, p := range openRoutes {
				if !keyOpen(fl, te.Engine, http.MethodGet, p) {
					t.Errorf("the fake wants the key on %s, which the %s driver's exposure report lists as open", p, family)
				}
			}
			var paths []string
			for _, r := range fl.Routes(te.Engine) {
				_, p, _ := strings.Cut(r.Pattern, " ")
				paths = append(paths, p)
			}
			for _, g := range enginefacts.Values(d.GuardedPrefixes) {
				paths = append(paths, g+"/chat/completions")
			}
			slices.Sort(paths)
			for _, p := range slices.Compact(paths) {
				if strings.HasPrefix(p, "/fake/") || slices.Contains(openRoutes, p) {
					continue // the testkit's own routes; the open ones
				}
				if keyOpen(fl, te.Engine, http.MethodGet, p) || keyOpen(fl, te.Engine, http.MethodPost, p) {
					t.Errorf("the fake answers %s without the key, which the %s driver's exposure report does not list as open", p, family)
				}
			}
		})
	}
}
