// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginefacts

import (
	"slices"
	"strings"
	"testing"
)

// TestTables_WellFormed checks every table: a family, a source for every
// fact, no route listed twice, the idle signal's gauges named.
func TestTables_WellFormed(t *testing.T) {
	for _, e := range Engines() {
		t.Run(e.Family, func(t *testing.T) {
			if e.Family == "" || e.Name == "" || e.Versions == "" {
				t.Fatalf("family %q, name %q, versions %q", e.Family, e.Name, e.Versions)
			}
			if Lookup(e.Family) != e {
				t.Errorf("Lookup(%q) is not the table", e.Family)
			}
			all := [][]Fact{e.Park, e.Levels, e.Abort, {e.Metrics.Running, e.Metrics.Waiting}, e.Metrics.KVUsage,
				e.Metrics.Figures, e.GuardedPrefixes, e.OpenPrefixes, e.OpenRoutes, e.ParkOpenRoutes, e.Env, e.APIRoutes}
			for _, fs := range all {
				for _, f := range fs {
					if f.Value == "" || f.Source == "" {
						t.Errorf("fact %+v lacks a value or a source", f)
					}
				}
			}
			routes := append(Values(e.OpenRoutes), Values(e.ParkOpenRoutes)...)
			sorted := slices.Clone(routes)
			slices.Sort(sorted)
			if len(slices.Compact(sorted)) != len(routes) {
				t.Errorf("a route is listed twice: %v", routes)
			}
			for _, r := range routes {
				for _, g := range Values(e.GuardedPrefixes) {
					if r == g || strings.HasPrefix(r, g+"/") {
						t.Errorf("open route %s is under the guarded prefix %s", r, g)
					}
				}
			}
			md := e.Markdown()
			for _, n := range e.Metrics.Names() {
				if !strings.Contains(md, "`"+n+"`") {
					t.Errorf("the page table lacks %s", n)
				}
			}
		})
	}
}

// TestPath_UnknownKeyPanics: a driver asking for a path its table lacks
// fails when its package loads, not with an empty path at run time.
func TestPath_UnknownKeyPanics(t *testing.T) {
	if VLLM.Path("sleep") != "/sleep" || SGLang.Path("abort") != "/abort_request" {
		t.Fatalf("sleep %q, abort %q", VLLM.Path("sleep"), SGLang.Path("abort"))
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Path(no-such) did not panic")
		}
	}()
	VLLM.Path("no-such")
}

// TestRoute_Keys: the API routes a driver names come from the table, and
// every key is one the endpoint has a field for.
func TestRoute_Keys(t *testing.T) {
	known := []string{RouteMessages, RouteCountTokens, RouteResponses}
	for _, e := range Engines() {
		for _, f := range e.APIRoutes {
			if f.Key != "" && !slices.Contains(known, f.Key) {
				t.Errorf("%s: API route key %q is not one of %v", e.Family, f.Key, known)
			}
		}
	}
	if VLLM.Route(RouteMessages) != "/v1/messages" || LlamaCpp.Route(RouteCountTokens) != "/v1/messages/count_tokens" {
		t.Errorf("routes: %q %q", VLLM.Route(RouteMessages), LlamaCpp.Route(RouteCountTokens))
	}
	if SGLang.Route(RouteMessages) != "" || LlamaCpp.Route(RouteMessages) != "" || TensorFold.Route(RouteResponses) != "" {
		t.Error("a route recorded as not used is named")
	}
}
