// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_EngineClosesAfterEveryStream: an engine that closes the
// connection after every streamed answer while its head says keep-alive
// (llama-server b4748) costs no request: the router never sends on a
// connection the engine closed, and places are all free afterwards.
// Before the check, the pooled connections were reused and their single
// retry took the next pooled one, closed as well: 503 unexpected EOF.
func TestRouter_EngineClosesAfterEveryStream(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{CloseAfterStream: true, Tokens: 4}})
	const clients, each = 4, 50
	var (
		mu   sync.Mutex
		fail []string
	)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				// Streamed and non-streamed in turn: a non-streamed request
				// sent on a connection a stream's answer left behind.
				stream := (i+c)%2 == 0
				resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(stream, ""), nil)
				if err != nil {
					mu.Lock()
					fail = append(fail, err.Error())
					mu.Unlock()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				ok := resp.StatusCode == 200 && (!stream || strings.HasSuffix(string(b), "data: [DONE]\n\n"))
				if !ok {
					mu.Lock()
					fail = append(fail, fmt.Sprintf("%d %s", resp.StatusCode, b))
					mu.Unlock()
				}
			}
		}(c)
	}
	wg.Wait()
	if len(fail) > 0 {
		t.Fatalf("%d of %d requests failed, first: %s", len(fail), clients*each, fail[0])
	}
	waitFor(t, "every place free", e.idle)
	if n := staleCount(t, e); n == 0 {
		t.Fatal("no stale connection was seen: the engine did not close after its streams, the test proves nothing")
	}
}

// staleCount reads capyctl_engine_connections_stale_total.
func staleCount(t *testing.T, e *env) int {
	t.Helper()
	rec := httptest.NewRecorder()
	e.rt.MetricsHandler().ServeHTTP(rec, &http.Request{Method: "GET", Header: http.Header{}, URL: &url.URL{Path: "/metrics"}})
	m := regexp.MustCompile(`(?m)^capyctl_engine_connections_stale_total (\d+)`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		t.Fatalf("no stale counter in /metrics:\n%s", rec.Body.String())
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
