// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/enginefacts"
)

// TestAPIRoutes_FakesServeTheirFacts: each fake serves exactly the API
// routes its facts list, and every route a driver names for the router
// (sdk/enginefacts' native API routes) is one its fake serves, except
// where the fake reproduces a build older than the route (llama-server
// b4748, which answers it 404 as that build does).
func TestAPIRoutes_FakesServeTheirFacts(t *testing.T) {
	flavours := map[string]fakeengine.Flavour{
		"vllm": fakeengine.NewVLLM(fakeengine.VLLMOptions{}), "sglang": fakeengine.NewSGLang(fakeengine.SGLangOptions{}),
		"llamacpp": fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{}),
	}
	older := map[string]string{"llamacpp": "the fake reproduces llama-server b4748, older than /v1/messages/count_tokens"}
	for family, fl := range flavours {
		t.Run(family, func(t *testing.T) {
			e, err := fakeengine.New(fakeengine.Config{Flavour: fl, ServedName: "m"})
			if err != nil {
				t.Fatal(err)
			}
			var served []string
			for _, r := range fl.Routes(e) {
				if strings.Contains(r.Pattern, "/v1/messages") || strings.Contains(r.Pattern, "/v1/responses") {
					served = append(served, r.Pattern)
				}
			}
			var facts []string
			for _, r := range fakeengine.APIRoutes[family] {
				facts = append(facts, r.Pattern)
				if r.Source == "" {
					t.Errorf("%s has no source", r.Pattern)
				}
			}
			slices.Sort(served)
			slices.Sort(facts)
			if !slices.Equal(served, facts) {
				t.Errorf("the fake serves %v, its facts list %v", served, facts)
			}
			for _, f := range enginefacts.Lookup(family).APIRoutes {
				if f.Key == "" || older[family] != "" {
					continue
				}
				if !slices.Contains(facts, "POST "+f.Value) {
					t.Errorf("the driver sends %s requests to %s, which the fake does not serve", f.Key, f.Value)
				}
			}
		})
	}
}
