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
	"github.com/capyctl/capyctl/sdk/enginefacts"
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

// TestFacts_EveryEngineHasAFake keeps the list above complete.
func TestFacts_EveryEngineHasAFake(t *testing.T) {
	fl := factsFlavours()
	for _, e := range enginefacts.Engines() {
		if fl[e.Family] == nil {
			t.Errorf("engine table %s has no fake in factsFlavours", e.Family)
		}
	}
}

// TestFacts_FakeMetricsCarryTheTable proves that each fake's /metrics
// serves every name its engine table (which its driver reads) lists: the
// running and waiting gauges, every figure, and at least one of the KV
// usage names (the driver takes the first found).
func TestFacts_FakeMetricsCarryTheTable(t *testing.T) {
	for family, mk := range factsFlavours() {
		t.Run(family, func(t *testing.T) {
			e := enginefacts.Lookup(family)
			te := startEngine(t, fakeengine.Config{ServedName: "m", APIKey: "k", Flavour: mk()}, true)
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
			want := append([]string{e.Metrics.Running.Value, e.Metrics.Waiting.Value}, enginefacts.Values(e.Metrics.Figures)...)
			for _, n := range want {
				if !served[n] {
					t.Errorf("the fake's /metrics lacks %s, which the %s table lists", n, family)
				}
			}
			if kv := enginefacts.Values(e.Metrics.KVUsage); len(kv) > 0 && !slices.ContainsFunc(kv, func(n string) bool { return served[n] }) {
				t.Errorf("the fake's /metrics has none of the KV usage names %v", kv)
			}
		})
	}
}

// TestFacts_FakeKeyExemptionsAreTheTables proves that what each fake
// answers without the key is exactly its table's open routes (the routes
// the driver's exposure report lists): every open route passes the key
// check, and every other route the fake serves, and a path under each
// guarded prefix, is refused without the key.
func TestFacts_FakeKeyExemptionsAreTheTables(t *testing.T) {
	for family, mk := range factsFlavours() {
		t.Run(family, func(t *testing.T) {
			e := enginefacts.Lookup(family)
			f := mk()
			te := startEngine(t, fakeengine.Config{ServedName: "m", APIKey: "k", Flavour: f}, true)
			passed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
			h := f.Middleware(te.Engine, passed)
			open := func(method, path string) bool {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
				return rec.Code == http.StatusTeapot
			}
			openRoutes := append(enginefacts.Values(e.OpenRoutes), enginefacts.Values(e.ParkOpenRoutes)...)
			for _, p := range openRoutes {
				if !open(http.MethodGet, p) {
					t.Errorf("the fake wants the key on %s, which the %s table (and the driver's exposure report) lists as open", p, family)
				}
			}
			var paths []string
			for _, r := range f.Routes(te.Engine) {
				_, p, _ := strings.Cut(r.Pattern, " ")
				paths = append(paths, p)
			}
			for _, g := range enginefacts.Values(e.GuardedPrefixes) {
				paths = append(paths, g+"/chat/completions")
			}
			slices.Sort(paths)
			for _, p := range slices.Compact(paths) {
				if strings.HasPrefix(p, "/fake/") || slices.Contains(openRoutes, p) {
					continue // the testkit's own routes; the open ones
				}
				if open(http.MethodGet, p) || open(http.MethodPost, p) {
					t.Errorf("the fake answers %s without the key, which the %s table does not list as open", p, family)
				}
			}
		})
	}
}
