// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_FairPlacesByKey: one place, key A with 200 requests waiting
// for it, then one request of key B: B's request starts within two
// service times (after the request being served when it came, and one
// more of A's), through the real router, HTTP and a fake engine. Each
// request is served until the test hangs it up, so "a service time" is
// one place freed, and nothing is timed.
func TestRouter_FairPlacesByKey(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{StallAfterTokens: 1, MaxRunning: 300},
		spec: func(d *structs.Deployment) {
			d.EngineConfig.MaxConcurrentRequests = 1
			d.Limits.MaxWaiting = 250
		},
		router: func(c *router.Config) { c.MaxWaitingTotal = 300 },
		wrap: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(router.WithCaller(r.Context(), router.Caller{Key: r.Header.Get("X-Test-Key"), Weight: 1})))
			})
		},
	})
	ctx, cancelAll := context.WithTimeout(context.Background(), testDeadline)
	defer cancelAll()
	tr := &http.Transport{MaxIdleConnsPerHost: 300}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	type started struct {
		who    string
		cancel context.CancelFunc
	}
	starts := make(chan started, 300)
	done := make(chan struct{}, 300)
	send := func(who string) {
		rctx, cancel := context.WithCancel(ctx)
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody(true, "")))
			req.Header.Set("X-Test-Key", who[:1])
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: {") {
					starts <- started{who: who, cancel: cancel} // served: its first token came
					break
				}
			}
			<-rctx.Done()
		}()
	}
	send("A-first")
	first := <-starts
	for i := 0; i < 200; i++ {
		send("A")
	}
	waitFor(t, "200 of A waiting behind the one served", func() bool { return e.count("waiting") == 200 })
	send("B")
	waitFor(t, "B waiting too", func() bool { return e.count("waiting") == 201 })
	// Free the place, one service at a time, until B is served.
	current, freed := first, 0
	for current.who != "B" {
		current.cancel()
		freed++
		select {
		case current = <-starts:
		case <-ctx.Done():
			t.Fatalf("nobody was served after %d places freed", freed)
		}
	}
	if freed > 2 {
		t.Fatalf("B started after %d places were freed, behind 200 of A; want within two service times", freed)
	}
	if w := e.count("waiting"); w != 199 {
		t.Fatalf("%d still waiting after B started, want 199 of A", w)
	}
	cancelAll()
	for i := 0; i < 202; i++ {
		within(t, "every client to end", done)
	}
	e.settleAfterCuts(t)
}
