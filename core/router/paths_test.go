// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/decisions"
)

// TestRouter_DefaultEnginePaths: an endpoint that names no chat or
// decisions path is asked on the OpenAI and SystemOne defaults.
func TestRouter_DefaultEnginePaths(t *testing.T) {
	e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) { ep.ChatPath = "" }})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 {
		t.Fatalf("chat without a path: %d %s", resp.StatusCode, body)
	}

	f, err := fakeengine.FlavourByName("decisions")
	if err != nil {
		t.Fatal(err)
	}
	d := newEnv(t, envOpts{engine: fakeengine.Config{Flavour: f}, api: structs.APIDecisions, ep: func(ep *structs.EngineEndpoint) {
		ep.RequestIDField = "rid"
		ep.DecisionsPath = ""
	}})
	resp, err = d.post(context.Background(), decisions.Path, decisionBody, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 {
		t.Fatalf("decisions without a path: %d %s", resp.StatusCode, body)
	}
}
