// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// TestRouter_KeepAliveCommentsWhileWaiting: a streamed request that waits
// for its model (here another model's turn) gets a progress comment at
// every interval, with the expected wait and the model holding the memory,
// until it is served; a non-streamed request gets nothing at all until its
// answer (no status line either), then a whole JSON answer.
func TestRouter_KeepAliveCommentsWhileWaiting(t *testing.T) {
	e := newEnv(t, envOpts{noReady: true, router: func(c *router.Config) {
		c.ProgressAfter = time.Millisecond
		c.ProgressEvery = 20 * time.Millisecond
	}})
	e.lc.estimate.Store(&structs.WaitEstimate{Wait: 5 * time.Second, Switch: true, Holding: []string{"chat-a"}})
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // a failed test lets the waiting requests go
	e.lc.mu.Lock()
	e.lc.activate = func(ctx context.Context, dep string) error {
		select {
		case <-release:
			e.publish(true)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.lc.mu.Unlock()

	whole := make(chan *http.Response, 1)
	go func() {
		resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
		if err != nil {
			t.Error(err)
			close(whole)
			return
		}
		whole <- resp
	}()
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(true, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	comments := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		var got string
		for strings.Count(got, ": capyctl progress ") < 3 {
			n, err := resp.Body.Read(buf)
			if err != nil {
				break
			}
			got += string(buf[:n])
		}
		comments <- got
	}()
	var got string
	select {
	case got = <-comments:
	case <-time.After(10 * time.Second): // a failure's bound, not a timing
		t.Fatal("no three progress comments while waiting")
	}
	if strings.Count(got, ": capyctl progress ") < 3 {
		t.Fatalf("the stream ended after %q", got)
	}
	for _, line := range strings.Split(strings.TrimSpace(got), "\n\n")[:3] {
		var p struct {
			State   string   `json:"state"`
			ETA     int64    `json:"eta_ms"`
			Holding []string `json:"holding"`
		}
		body, ok := strings.CutPrefix(line, ": capyctl progress ")
		if !ok || json.Unmarshal([]byte(body), &p) != nil {
			t.Fatalf("not a progress comment: %q", line)
		}
		if p.ETA != 5000 || len(p.Holding) != 1 || p.Holding[0] != "chat-a" {
			t.Fatalf("progress %+v: want eta 5000 ms, holding chat-a", p)
		}
	}
	select {
	case r := <-whole:
		t.Fatalf("the non-streamed request was answered while waiting: %v", r)
	default:
	}
	releaseOnce()
	rest := readBody(t, resp)
	if data, _ := sseLines(rest); len(data) < 2 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream after the progress: %q", rest)
	}
	r, ok := <-whole
	if !ok {
		t.Fatal("no answer to the non-streamed request")
	}
	body := readBody(t, r)
	if r.StatusCode != http.StatusOK || !strings.HasPrefix(body, "{") || strings.Contains(body, "progress") {
		t.Fatalf("non-streamed answer %d %q", r.StatusCode, body)
	}
	waitFor(t, "idle", e.idle)
}

// TestRouter_RefusedBeyondTheBound: a request whose model waits for memory
// other models hold, longer than what is left of its deadline, is refused
// at once with 429 insufficient_resources, a Retry-After of the expected
// wait and details naming the model holding the memory, without starting
// the switch; within the bound (by the measured figures: never on a
// placeholder) it waits and is served.
func TestRouter_RefusedBeyondTheBound(t *testing.T) {
	e := newEnv(t, envOpts{noReady: true, spec: func(d *structs.Deployment) {
		d.RequestDeadline = structs.Duration(2 * time.Second)
	}})
	e.lc.estimate.Store(&structs.WaitEstimate{Wait: 5500 * time.Millisecond, Floor: 5500 * time.Millisecond, Switch: true, Holding: []string{"chat-a"}, Ahead: 1})
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	var env struct {
		Error struct {
			Code      string         `json:"code"`
			Retryable bool           `json:"retryable"`
			Details   map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if resp.StatusCode != http.StatusTooManyRequests || env.Error.Code != string(structs.CodeInsufficientResources) || !env.Error.Retryable {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "6" {
		t.Fatalf("Retry-After %q, want 6 (5.5 s expected)", ra)
	}
	d := env.Error.Details
	if h, _ := d["holding"].([]any); len(h) != 1 || h[0] != "chat-a" || d["expected_wait_ms"] != float64(5500) || d["turns_ahead"] != float64(1) {
		t.Fatalf("details %v", d)
	}
	if n := e.lc.acts.Load(); n != 0 {
		t.Fatalf("%d activations for a refused request", n)
	}

	// Past the bound only with placeholder figures (the measured ones give
	// 1 s): it waits, and is served.
	e.lc.estimate.Store(&structs.WaitEstimate{Wait: 5500 * time.Millisecond, Floor: time.Second, Switch: true, Holding: []string{"chat-a"}})
	e.lc.mu.Lock()
	e.lc.activate = func(context.Context, string) error { e.publish(true); return nil }
	e.lc.mu.Unlock()
	resp, err = e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("within the bound: %d %s", resp.StatusCode, body)
	}
}
