// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestRouter_KeptAliveConnectionAfterAStreamCarriesNoDeadline: a stream
// the router took over bounds each write by the client read bound
// (limits.client_read_idle, 10 s by default). The connection then waits
// for the client's next request; that request, sent after more than the
// bound, must be answered whatever its answer begins with. Before, the
// deadline of the stream's last write stayed on the connection: a next
// stream that waited for its model to start flushed its progress comment
// into an expired deadline, and the client saw the connection closed with
// no answer (found by the soak: "Post ...: EOF" on a connection idle for
// 10 s, the next request a stream to a stopped model).
func TestRouter_KeptAliveConnectionAfterAStreamCarriesNoDeadline(t *testing.T) {
	const bound = 50 * time.Millisecond
	// A stream long enough to be taken over from net/http, and progress
	// comments soon while a request waits for its model.
	e := newEnv(t, envOpts{engine: fakeengine.Config{Tokens: 40, TokenRate: 400},
		spec: func(d *structs.Deployment) { d.Limits.ClientReadIdle = structs.Duration(bound) },
		router: func(c *router.Config) {
			c.ProgressAfter = 10 * time.Millisecond
			c.ProgressEvery = 10 * time.Millisecond
		}})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	send := func(body string) (int, string, bool, error) {
		var reused bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", reused, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), reused, err
	}
	code, body, _, err := send(chatBody(true, ""))
	if err != nil || code != http.StatusOK || !strings.Contains(body, "[DONE]") {
		t.Fatalf("the stream: %d %v %q", code, err, body)
	}
	waitFor(t, "the taken-over connection waiting for its next request", func() bool { return e.rt.IdleConns() == 1 })
	// The model stops; a request starts it again, which takes a while.
	e.publish(false)
	e.lc.mu.Lock()
	e.lc.activate = func(ctx context.Context, dep string) error {
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		e.publish(true)
		return nil
	}
	e.lc.mu.Unlock()
	// Idle well past the client read bound (the idle time is the test's
	// subject, not a wait for a condition).
	time.Sleep(4 * bound)
	code, body, reused, err := send(chatBody(true, ""))
	if !reused {
		t.Fatal("the next request did not reuse the connection: the test proves nothing")
	}
	if err != nil || code != http.StatusOK || !strings.Contains(body, "capyctl progress") || !strings.Contains(body, "[DONE]") {
		t.Fatalf("a stream waiting for its model, on the kept-alive connection: %d %v %q", code, err, body)
	}
}
