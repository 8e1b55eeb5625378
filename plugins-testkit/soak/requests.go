// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// requestBound bounds a request from its send to the end of its answer:
// the deployments' request deadline (until the first output, an
// activation and a switch included), the answer itself (at most 32
// tokens at 400 a second) and a margin for a loaded machine.
const requestBound = 20*time.Second + 15*time.Second

// maxInFlight bounds the requests the soak keeps in flight at once.
const maxInFlight = 8

// requests are the soak's requests in flight, each on a goroutine of its
// own, and what they ended with.
type requests struct {
	// target is where requests go now (the role's inference endpoint and
	// API key; a restarted role listens elsewhere).
	target func() (base, key string)
	// codes are the catalogue's codes and their HTTP statuses.
	codes  map[string]int
	client *http.Client
	slots  chan struct{}
	wg     sync.WaitGroup

	// life counts the role's lives: a request that began before a kill
	// -9 of the role may end without an answer.
	life atomic.Int64

	mu       sync.Mutex
	outcomes map[string]int
	broken   lockedSet
}

func newRequests(target func() (string, string), codes map[string]int) *requests {
	return &requests{
		target:   target,
		codes:    codes,
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: maxInFlight}},
		slots:    make(chan struct{}, maxInFlight),
		outcomes: map[string]int{},
	}
}

// roleKilled marks the requests in flight as begun in an earlier life.
func (q *requests) roleKilled() { q.life.Add(1) }

// wait returns once every request in flight ended (each is bounded).
func (q *requests) wait() { q.wg.Wait() }

// close waits for the requests and drops idle connections.
func (q *requests) close() {
	q.wait()
	q.client.CloseIdleConnections()
}

// count records an outcome.
func (q *requests) count(outcome string) {
	q.mu.Lock()
	q.outcomes[outcome]++
	q.mu.Unlock()
}

// snapshot returns the outcomes so far.
func (q *requests) snapshotOutcomes() map[string]int {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[string]int, len(q.outcomes))
	for k, v := range q.outcomes {
		out[k] = v
	}
	return out
}

// hangUp is where a hang-up cuts a request: none, before any answer (at a
// random delay after the send), or after the first n chunks of a stream.
type hangUp struct {
	after  time.Duration
	chunks int
	active bool
}

// send starts a request in the background; it returns once the request
// holds one of the in-flight places (waiting for one when all are taken).
func (q *requests) send(model string, stream bool, h hangUp, tokens int) {
	q.slots <- struct{}{}
	base, key := q.target()
	life := q.life.Load()
	q.wg.Add(1)
	go func() {
		defer func() { <-q.slots; q.wg.Done() }()
		outcome, broken := q.do(base, key, model, stream, h, tokens)
		if broken != "" && q.life.Load() != life {
			// The role was killed while it ran: no answer is owed.
			outcome, broken = "cut by the role's kill", ""
		}
		q.count(outcome)
		if broken != "" {
			q.broken.add(fmt.Sprintf("request for %s (stream %v, hang-up %+v): %s", model, stream, h, broken))
		}
	}()
}

// do sends one chat request and classifies how it ended: the outcome for
// the table, and what broke the invariant (empty when none).
func (q *requests) do(base, key, model string, stream bool, h hangUp, tokens int) (outcome, broken string) {
	ctx, cancel := context.WithTimeout(context.Background(), requestBound)
	defer cancel()
	rctx, hang := context.WithCancel(ctx)
	defer hang()
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": stream, "max_tokens": tokens,
		"messages": []map[string]string{{"role": "user", "content": "tell me a story"}},
	})
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	// Which connection carried the request, for a failure's report.
	var conn httptrace.GotConnInfo
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { conn = i },
	}))
	connNote := func() string {
		if conn.Conn == nil {
			return "no connection"
		}
		return fmt.Sprintf("connection %s, reused %v, was idle %v for %s", conn.Conn.LocalAddr(), conn.Reused, conn.WasIdle, conn.IdleTime)
	}
	if h.active && h.chunks == 0 {
		t := time.AfterFunc(h.after, hang)
		defer t.Stop()
	}
	resp, err := q.client.Do(req)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return "no answer within its bound", fmt.Sprintf("no answer within %s: %v", requestBound, err)
		case h.active:
			return "hung up", ""
		}
		return "transport error", "the connection failed: " + err.Error() + " (" + connNote() + ")"
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			if h.active {
				return "hung up", ""
			}
			if ctx.Err() != nil {
				return "no answer within its bound", fmt.Sprintf("the refusal did not arrive within %s", requestBound)
			}
			return "transport error", "reading the refusal: " + err.Error()
		}
		return q.refusal(resp.StatusCode, data)
	}
	if !stream {
		data, err := io.ReadAll(resp.Body)
		switch {
		case err != nil && h.active:
			return "hung up", ""
		case err != nil && ctx.Err() != nil:
			return "no answer within its bound", fmt.Sprintf("the answer did not end within %s", requestBound)
		case err != nil:
			return "transport error", "reading the answer: " + err.Error()
		}
		var ans struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if json.Unmarshal(data, &ans) != nil || len(ans.Choices) == 0 {
			return "malformed answer", fmt.Sprintf("200 without choices: %.200s", data)
		}
		return "answered", ""
	}
	// A stream ends with [DONE], or with an error event carrying a code.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	chunks := 0
	var last string
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		payload := strings.TrimPrefix(line, "data: ")
		if payload == "[DONE]" {
			return "answered (stream)", ""
		}
		last = payload
		chunks++
		if h.active && h.chunks > 0 && chunks >= h.chunks {
			hang()
			return "hung up", ""
		}
	}
	if h.active {
		return "hung up", ""
	}
	if ctx.Err() != nil {
		return "no answer within its bound", fmt.Sprintf("the stream did not end within %s (%d chunks)", requestBound, chunks)
	}
	var env struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(last), &env) == nil && env.Error.Code != "" {
		if _, ok := q.codes[env.Error.Code]; !ok {
			return "stream error " + env.Error.Code, fmt.Sprintf("the stream ended with code %q, outside the catalogue", env.Error.Code)
		}
		if env.Error.Code == "internal" {
			return "stream error internal", "the stream ended with an internal error: " + last
		}
		return "stream error " + env.Error.Code, ""
	}
	return "broken stream", fmt.Sprintf("the stream ended after %d chunks with neither [DONE] nor a coded error (%v)", chunks, sc.Err())
}

// refusal classifies a non-200 answer: a JSON error envelope whose code is
// in the catalogue, with the catalogue's HTTP status.
func (q *requests) refusal(status int, data []byte) (outcome, broken string) {
	var env struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &env) != nil || env.Error.Code == "" {
		return fmt.Sprintf("%d uncoded", status), fmt.Sprintf("answered %d without a coded error: %.200s", status, data)
	}
	code := env.Error.Code
	base := strings.SplitN(code, ":", 2)[0]
	want, ok := q.codes[base]
	switch {
	case !ok:
		return fmt.Sprintf("%d %s", status, code), fmt.Sprintf("answered %d with %q, outside the catalogue", status, code)
	case base == "internal":
		return fmt.Sprintf("%d %s", status, code), fmt.Sprintf("answered %d internal: %.200s", status, data)
	case want != status:
		return fmt.Sprintf("%d %s", status, code), fmt.Sprintf("answered %d with %s, whose status is %d", status, code, want)
	}
	return fmt.Sprintf("%d %s", status, code), ""
}

// opRequest sends a non-streamed request to a deployment of the pool (now
// and then to one that is not deployed: 404 unknown_model).
func (r *Runner) opRequest() (string, string) { return r.request(false, hangUp{}) }

// opStream sends a streamed request.
func (r *Runner) opStream() (string, string) { return r.request(true, hangUp{}) }

// opHangUp sends a request and hangs up at a random point: before any
// answer (at once, or after up to 500 ms: queued, activating, answering),
// or a stream after its first chunks.
func (r *Runner) opHangUp() (string, string) {
	stream := r.rng.IntN(2) == 0
	h := hangUp{active: true, after: time.Duration(r.rng.IntN(500)) * time.Millisecond}
	if stream && r.rng.IntN(2) == 0 {
		h.chunks = 1 + r.rng.IntN(4)
	}
	return r.request(stream, h)
}

func (r *Runner) request(stream bool, h hangUp) (string, string) {
	// Mostly a deployed model; now and then any of the pool (404
	// unknown_model when it is not deployed).
	name := r.names[r.rng.IntN(len(r.names))]
	if d := r.pick(deployed); d != nil && r.rng.IntN(10) > 0 {
		name = d.spec.name
	}
	tokens := 4 + r.rng.IntN(28)
	kind := "request"
	if stream {
		kind = "stream"
	}
	what := fmt.Sprintf("%s to %s (%d tokens)", kind, name, tokens)
	if h.active {
		if h.chunks > 0 {
			what += fmt.Sprintf(", hang-up after %d chunks", h.chunks)
		} else {
			what += fmt.Sprintf(", hang-up after %s", h.after)
		}
	}
	r.reqs.send(name, stream, h, tokens)
	return what, "sent"
}
