// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// An answer assembled for a client that asked for no stream, from an
// engine that closes its connection after every stream (llama-server), is
// read with a low-water mark once the router has seen the engine close:
// the relay is woken by the engine's close at the end, not by each of its
// events. Each guarantee of an assembled answer holds on that path too.

// learnClosing sends non-streamed requests of one token until the router
// has seen the engine close its connection after a stream.
func learnClosing(t *testing.T, e *env) {
	t.Helper()
	for i := 0; i < 20 && e.rt.EnginesClosingAfterStream() == 0; i++ {
		resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, `,"max_tokens":1`), nil)
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != 200 {
			t.Fatalf("warm-up answer %d %s", resp.StatusCode, body)
		}
	}
	if e.rt.EnginesClosingAfterStream() != 1 {
		t.Fatal("the router never saw the engine close its connection after a stream")
	}
}

// assembled is the part of an assembled answer the tests read.
type assembled struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Capyctl struct {
		Metrics map[string]json.RawMessage `json:"metrics"`
	} `json:"capyctl"`
}

func TestRouter_AssembledAnswerFromClosingEngineWakesAtItsEnd(t *testing.T) {
	// 40 tokens 4 ms apart: faster than nothing, slower than the 5 ms
	// gather would batch more than one or two of them.
	e := newEnv(t, envOpts{engine: fakeengine.Config{CloseAfterStream: true, Tokens: 40, TokenRate: 250}})
	learnClosing(t, e)
	before := e.rt.AssembledEngineReads()
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	reads := e.rt.AssembledEngineReads() - before
	var a assembled
	if err := json.Unmarshal([]byte(body), &a); err != nil || resp.StatusCode != 200 {
		t.Fatalf("answer %d %s (%v)", resp.StatusCode, body, err)
	}
	if len(a.Choices) != 1 || a.Choices[0].FinishReason == "" || a.Usage == nil || a.Usage.CompletionTokens != 40 {
		t.Fatalf("incomplete answer: %s", body)
	}
	if n := len(strings.Fields(a.Choices[0].Message.Content)); n < 30 {
		t.Fatalf("answer has %d words of 40 tokens: %s", n, body)
	}
	if len(a.Capyctl.Metrics) == 0 {
		t.Fatalf("no per-answer metrics: %s", body)
	}
	// The relay is woken for the first token (time to first token is read
	// as it happens), then once, by the engine's close: the reads counted
	// are those the relay was woken for, so a loaded machine that spreads
	// the 40 tokens over several of the clock's looks (every 200 ms, which
	// find the pending tokens without a wake-up) does not change the
	// count. Without the mark every token or two wakes the relay (20-40).
	if reads > 3 {
		t.Fatalf("the relay was woken %d times for one answer of 40 tokens, want at most 3 (the first token, the engine's close)", reads)
	}
	waitFor(t, "idle", e.idle)
}

func TestRouter_AssembledAnswerFromClosingEngineHangUp(t *testing.T) {
	e := newEnv(t, envOpts{engine: fakeengine.Config{CloseAfterStream: true, StallAfterTokens: 3}})
	learnClosing(t, e)
	base := e.eng.Stats().GenerationTokens
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.post(ctx, "/v1/chat/completions", chatBody(false, ""), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the engine to generate", func() bool { return e.eng.Stats().GenerationTokens >= base+3 })
	e.lc.noReading.Store(true)
	hungUp := time.Now()
	cancel()
	<-done
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	if s := e.eng.Stats(); s.Running != 0 || s.LastCancelUnixNano < hungUp.UnixNano() {
		t.Fatalf("engine %+v", s)
	}
	e.heldUntilReading(t, router.OutcomeCancelled, 1)
	e.settleAfterCuts(t)
}

func TestRouter_AssembledAnswerFromClosingEngineStalls(t *testing.T) {
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{CloseAfterStream: true, StallAfterTokens: 2},
		spec:   func(d *structs.Deployment) { d.Limits.StreamIdle = structs.Duration(300 * time.Millisecond) },
	})
	learnClosing(t, e)
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); errCode(body) != "stream_stalled" {
		t.Fatalf("answer %d %s, want stream_stalled", resp.StatusCode, body)
	}
	waitFor(t, "the engine to cancel", func() bool { return e.eng.Stats().Cancelled == 1 })
	waitFor(t, "idle", e.idle)
}

func TestRouter_AssembledAnswerFromClosingEngineSlowerThanTheIdleBoundPerRead(t *testing.T) {
	// 12 tokens 50 ms apart under an idle bound of 150 ms (shorter than
	// the low-water read's own look every 200 ms): the answer runs for
	// 600 ms, far past the bound, and must not be cut, although its
	// events stay under the low-water mark and wake nobody.
	e := newEnv(t, envOpts{
		engine: fakeengine.Config{CloseAfterStream: true, Tokens: 12, TokenRate: 20},
		spec:   func(d *structs.Deployment) { d.Limits.StreamIdle = structs.Duration(150 * time.Millisecond) },
	})
	learnClosing(t, e)
	resp, err := e.post(context.Background(), "/v1/chat/completions", chatBody(false, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	var a assembled
	if err := json.Unmarshal([]byte(body), &a); err != nil || resp.StatusCode != 200 || a.Usage == nil || a.Usage.CompletionTokens != 12 {
		t.Fatalf("answer %d %s (%v)", resp.StatusCode, body, err)
	}
	waitFor(t, "idle", e.idle)
}
