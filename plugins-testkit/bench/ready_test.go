// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// BenchmarkRouter_ReadyToForward is the time from "an instance is ready"
// (the lifecycle publishes a route table with it) to "a request that waited
// for a place was forwarded to it": a deployment with one place, held by a
// stream on its first instance, and a second request waiting; then the
// second instance becomes ready. The router learns of the new table from
// the board's change signal (it polled every 100 ms before).
func BenchmarkRouter_ReadyToForward(b *testing.B) {
	stall, stallURL := benchEngine(b, fakeengine.Config{StallAfterTokens: 1})
	second, secondURL := benchEngine(b, fakeengine.Config{Tokens: 4})
	_ = stall
	spec := &structs.Deployment{Name: "m", API: structs.APIChat, Routes: []string{"m"}, Instances: 2}
	spec.EngineConfig.MaxConcurrentRequests = 1
	target := func(i string, url string) *routes.Target {
		return &routes.Target{Instance: i, Generation: 1, Endpoint: structs.EngineEndpoint{BaseURL: url, ChatPath: "/v1/chat/completions", ServedName: "m"}}
	}
	route := func(ts ...*routes.Target) *routes.Route {
		return &routes.Route{Deployment: "m", API: structs.APIChat, Routes: []string{"m"}, Desired: structs.DesiredRunning, Spec: spec, Instances: 2, Ready: ts}
	}
	var lat []time.Duration
	n := max(b.N, 20)
	for i := 0; i < n; i++ {
		l := newLC(route(target("m/0", stallURL)))
		rt := router.New(router.Config{Lifecycle: l})
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/chat/completions", rt.ChatCompletions)
		srv := httptest.NewServer(mux)
		ctx, cancel := context.WithCancel(context.Background())
		// The stream that holds the only place.
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		waitBench(b, func() bool { return count(rt, "in_flight") == 1 })
		before := second.Stats().Total
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(smallBody))
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		waitBench(b, func() bool { return count(rt, "waiting") == 1 })
		start := time.Now()
		l.b.Publish(routes.NewTable(route(target("m/0", stallURL), target("m/1", secondURL))))
		waitBench(b, func() bool { return second.Stats().Total > before })
		lat = append(lat, time.Since(start))
		<-done
		cancel()
		srv.Close()
		rt.Close()
	}
	b.ReportMetric(pct(lat, 0.5), "ready-to-forward-p50-ms")
	b.ReportMetric(pct(lat, 0.99), "ready-to-forward-p99-ms")
}

// waitBench polls cond every 20 µs (a benchmark measures what follows).
func waitBench(b *testing.B, cond func() bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("timed out")
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func count(rt *router.Router, k string) int {
	v, _ := rt.DeploymentRequests("m")[k].(int)
	return v
}
