// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// factsFlavours are the fakes of the first-party engines, keyed "k",
// configured as the drivers launch them (metrics on; vLLM in development
// and sleep mode, as when it parks).
func factsFlavours() map[string]func() fakeengine.Flavour {
	return map[string]func() fakeengine.Flavour{
		"vllm": func() fakeengine.Flavour {
			return fakeengine.NewVLLM(fakeengine.VLLMOptions{DevMode: true, SleepMode: true})
		},
		"sglang": func() fakeengine.Flavour { return fakeengine.NewSGLang(fakeengine.SGLangOptions{Metrics: true}) },
		"llamacpp": func() fakeengine.Flavour {
			return fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{ModelPath: "stories260K.gguf", Metrics: true})
		},
		"tensorfold": func() fakeengine.Flavour { return fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{}) },
	}
}

// TestFacts_WellFormed checks the fakes' own tables: each fact has a value
// and a source, and every family has a fake.
func TestFacts_WellFormed(t *testing.T) {
	fl := factsFlavours()
	for family := range fl {
		f := fakeengine.FactsFor(family)
		if f == nil {
			t.Fatalf("no facts for %s", family)
		}
		all := append([]fakeengine.Fact{f.Running, f.Waiting}, f.Figures...)
		all = append(append(append(all, f.GuardedPrefixes...), f.OpenPrefixes...), f.OpenRoutes...)
		if f.KVUsage.Value != "" {
			all = append(all, f.KVUsage)
		}
		for _, x := range all {
			if x.Value == "" || x.Source == "" {
				t.Errorf("%s: fact %+v lacks a value or a source", family, x)
			}
		}
	}
	for _, x := range fakeengine.BehaviourFacts() {
		if x.Value == "" || x.Source == "" {
			t.Errorf("behaviour fact %+v lacks a value or a source", x)
		}
	}
}

// servedMetrics scrapes a fake's /metrics and returns the sample names.
func servedMetrics(t *testing.T, f fakeengine.Flavour) map[string]bool {
	t.Helper()
	te := startEngine(t, fakeengine.Config{ServedName: "m", APIKey: "k", Flavour: f}, true)
	status, data, _ := do(t, http.MethodGet, te.url+"/metrics", "", map[string]string{"Authorization": "Bearer k"})
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, data)
	}
	served := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		served[name] = true
	}
	return served
}

// TestFacts_FakeMetricsAreItsFacts proves that each fake's /metrics serves
// exactly the names of its own facts (the gauges, the KV usage when its
// engine has one, the figures), so a fact removed upstream is removed
// from the fake with its row.
func TestFacts_FakeMetricsAreItsFacts(t *testing.T) {
	for family, mk := range factsFlavours() {
		t.Run(family, func(t *testing.T) {
			served := servedMetrics(t, mk())
			want := fakeengine.FactsFor(family).MetricNames()
			for _, n := range want {
				if !served[n] {
					t.Errorf("the fake's /metrics lacks %s, which its facts list", n)
				}
			}
			for n := range served {
				if !slices.Contains(want, n) {
					t.Errorf("the fake's /metrics serves %s, which its facts do not list", n)
				}
			}
		})
	}
}

// keyOpen reports whether the flavour's middleware lets a request through
// without the key.
func keyOpen(f fakeengine.Flavour, e *fakeengine.Engine, method, path string) bool {
	passed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	rec := httptest.NewRecorder()
	f.Middleware(e, passed).ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code == http.StatusTeapot
}

// factsOpen is what a family's facts say of a path without the key.
func factsOpen(f *fakeengine.EngineFacts, path string) bool {
	switch {
	case len(f.GuardedPrefixes) > 0:
		for _, g := range fakeengine.Values(f.GuardedPrefixes) {
			if path == g || strings.HasPrefix(path, g+"/") {
				return false
			}
		}
		return true
	case len(f.OpenPrefixes) > 0:
		for _, p := range fakeengine.Values(f.OpenPrefixes) {
			if strings.HasPrefix(path, p) {
				return true
			}
		}
		return false
	}
	return slices.Contains(fakeengine.Values(f.OpenRoutes), path)
}

// TestFacts_FakeKeyExemptionsAreItsFacts proves that each fake's key check
// follows its own facts on every route it serves and under every guarded
// prefix.
func TestFacts_FakeKeyExemptionsAreItsFacts(t *testing.T) {
	for family, mk := range factsFlavours() {
		t.Run(family, func(t *testing.T) {
			f := mk()
			facts := fakeengine.FactsFor(family)
			te := startEngine(t, fakeengine.Config{ServedName: "m", APIKey: "k", Flavour: f}, true)
			paths := append(fakeengine.Values(facts.OpenRoutes), fakeengine.Values(facts.OpenPrefixes)...)
			for _, r := range f.Routes(te.Engine) {
				_, p, _ := strings.Cut(r.Pattern, " ")
				paths = append(paths, p)
			}
			for _, g := range fakeengine.Values(facts.GuardedPrefixes) {
				paths = append(paths, g+"/chat/completions")
			}
			slices.Sort(paths)
			for _, p := range slices.Compact(paths) {
				if strings.HasPrefix(p, "/fake/") {
					continue // the testkit's own routes
				}
				want := factsOpen(facts, p)
				if got := keyOpen(f, te.Engine, http.MethodGet, p) || keyOpen(f, te.Engine, http.MethodPost, p); got != want {
					t.Errorf("%s without the key: open %v, its facts say %v", p, got, want)
				}
			}
		})
	}
}
