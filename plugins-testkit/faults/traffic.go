// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// TrafficConfig shapes the steady load a fault runs under.
type TrafficConfig struct {
	// Model is the deployment every request names.
	Model string
	// Streams is how many streamed requests are kept open at once: each
	// one that ends is replaced by a new one.
	Streams int
	// StreamTokens is each stream's max_tokens; with the fake engine's
	// token rate it sets how long a stream stays open.
	StreamTokens int
	// StreamDeadline bounds one streamed request.
	StreamDeadline time.Duration
	// Rate is the non-streamed requests sent per second (on a ticker,
	// whatever the answers do).
	Rate int
	// RequestDeadline bounds one non-streamed request.
	RequestDeadline time.Duration
	// MaxInFlight caps the non-streamed requests waiting for an answer;
	// a tick past it is counted "not sent", so a stalled role cannot make
	// the generator pile up goroutines.
	MaxInFlight int
	// Lifetime bounds the whole generator: it stops by itself after it.
	Lifetime time.Duration
}

// target is where requests go: a core restart moves the role to new
// ports, so the suite swaps it.
type target struct {
	base string
	key  string
}

// span is one successful non-streamed request.
type span struct{ start, end time.Time }

// Traffic is steady load on a role's inference endpoint (loopback only):
// Streams streamed requests kept open and Rate non-streamed requests a
// second, each with a deadline, every outcome counted by status and error
// code. It stops after Lifetime, or at Stop.
type Traffic struct {
	cfg    TrafficConfig
	client *http.Client
	tgt    atomic.Pointer[target]
	open   atomic.Int64
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	streams   map[string]int
	requests  map[string]int
	successes []span
}

// Outcomes are request outcomes by kind: "ok", or an HTTP status with the
// error code of its body ("503 unavailable"), or what broke the connection
// ("connection refused", "stream cut", "timeout").
type Outcomes struct {
	Streams  map[string]int
	Requests map[string]int
}

// StartTraffic starts the generator against base (an http:// URL of the
// inference listener) with the API key.
func StartTraffic(cfg TrafficConfig, base, key string) *Traffic {
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 8 * max(cfg.Rate, 1)
	}
	tr := &http.Transport{
		// Loopback only: the role listens on 127.0.0.1.
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: cfg.Streams + cfg.MaxInFlight,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Lifetime)
	t := &Traffic{
		cfg: cfg, client: &http.Client{Transport: tr}, ctx: ctx, cancel: cancel,
		streams: map[string]int{}, requests: map[string]int{},
	}
	t.SetTarget(base, key)
	for i := 0; i < cfg.Streams; i++ {
		t.wg.Add(1)
		go t.streamLoop()
	}
	t.wg.Add(1)
	go t.tickLoop()
	return t
}

// SetTarget points the generator at a role's new address (after a
// restart).
func (t *Traffic) SetTarget(base, key string) { t.tgt.Store(&target{base: base, key: key}) }

// Open is the number of streams open now (answered 200 and not ended).
func (t *Traffic) Open() int { return int(t.open.Load()) }

// Stop ends the generator and waits for its goroutines; requests it cuts
// are not counted.
func (t *Traffic) Stop() {
	t.cancel()
	t.wg.Wait()
	t.client.CloseIdleConnections()
}

// Outcomes copies the counts so far.
func (t *Traffic) Outcomes() Outcomes {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Outcomes{Streams: copyCounts(t.streams), Requests: copyCounts(t.requests)}
}

// LongestGap is the longest span within [from, to] in which no
// non-streamed request was answered 200: how long the role did not serve.
func (t *Traffic) LongestGap(from, to time.Time) time.Duration {
	t.mu.Lock()
	ends := make([]time.Time, 0, len(t.successes))
	for _, s := range t.successes {
		if !s.end.Before(from) && !s.end.After(to) {
			ends = append(ends, s.end)
		}
	}
	t.mu.Unlock()
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	longest, last := time.Duration(0), from
	for _, e := range append(ends, to) {
		if d := e.Sub(last); d > longest {
			longest = d
		}
		last = e
	}
	return longest
}

// ServedAfter returns how long after since the first non-streamed request
// sent at or after since was answered 200, and whether one was.
func (t *Traffic) ServedAfter(since time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	best, ok := time.Duration(0), false
	for _, s := range t.successes {
		if s.start.Before(since) {
			continue
		}
		if d := s.end.Sub(since); !ok || d < best {
			best, ok = d, true
		}
	}
	return best, ok
}

func (t *Traffic) record(stream bool, outcome string, start time.Time) {
	if t.ctx.Err() != nil {
		return // cut by Stop or the lifetime: not the role's doing
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if stream {
		t.streams[outcome]++
		return
	}
	t.requests[outcome]++
	if outcome == "ok" {
		t.successes = append(t.successes, span{start: start, end: time.Now()})
	}
}

func (t *Traffic) streamLoop() {
	defer t.wg.Done()
	for t.ctx.Err() == nil {
		if t.stream() != "ok" {
			// A role that refuses at once (down, restarting) is not
			// hammered: each stream slot tries again after a second.
			select {
			case <-t.ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (t *Traffic) stream() string {
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.StreamDeadline)
	defer cancel()
	resp, err := t.post(ctx, true, t.cfg.StreamTokens)
	if err != nil {
		out := transportOutcome(ctx, err)
		t.record(true, out, start)
		return out
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		out := statusOutcome(resp)
		t.record(true, out, start)
		return out
	}
	t.open.Add(1)
	defer t.open.Add(-1)
	out := readStream(ctx, resp.Body)
	t.record(true, out, start)
	return out
}

// readStream reads an SSE answer to its end: "ok" when it ends with
// [DONE], the error code of an error event, else what cut it.
func readStream(ctx context.Context, body io.Reader) string {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if data == "[DONE]" {
			return "ok"
		}
		if strings.HasPrefix(data, `{"error"`) {
			return "stream error " + errorCode([]byte(data))
		}
	}
	if ctx.Err() != nil {
		return "stream timeout"
	}
	return "stream cut"
}

func (t *Traffic) tickLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(time.Second / time.Duration(max(t.cfg.Rate, 1)))
	defer tick.Stop()
	var inFlight atomic.Int64
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
		if int(inFlight.Load()) >= t.cfg.MaxInFlight {
			t.record(false, fmt.Sprintf("not sent (%d waiting for an answer)", t.cfg.MaxInFlight), time.Now())
			continue
		}
		inFlight.Add(1)
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer inFlight.Add(-1)
			t.request()
		}()
	}
}

func (t *Traffic) request() {
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.RequestDeadline)
	defer cancel()
	resp, err := t.post(ctx, false, 1)
	if err != nil {
		t.record(false, transportOutcome(ctx, err), start)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.record(false, statusOutcome(resp), start)
		return
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.record(false, "body cut", start)
		return
	}
	t.record(false, "ok", start)
}

func (t *Traffic) post(ctx context.Context, stream bool, maxTokens int) (*http.Response, error) {
	tg := t.tgt.Load()
	body, _ := json.Marshal(map[string]any{
		"model": t.cfg.Model, "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": "tell me about capybaras"}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tg.key)
	return t.client.Do(req)
}

// statusOutcome is "<status> <code>" of an error answer (its body read,
// bounded).
func statusOutcome(resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return fmt.Sprintf("%d %s", resp.StatusCode, errorCode(b))
}

// errorCode is the code of a CapyCTL error envelope, or "-".
func errorCode(b []byte) string {
	var env struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &env) != nil || env.Error.Code == nil {
		return "-"
	}
	return fmt.Sprint(env.Error.Code)
}

// transportOutcome names why a request got no answer.
func transportOutcome(ctx context.Context, err error) string {
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	return "transport error"
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Sub returns the outcomes since an earlier copy.
func (o Outcomes) Sub(before Outcomes) Outcomes {
	sub := func(a, b map[string]int) map[string]int {
		out := map[string]int{}
		for k, v := range a {
			if d := v - b[k]; d != 0 {
				out[k] = d
			}
		}
		return out
	}
	return Outcomes{Streams: sub(o.Streams, before.Streams), Requests: sub(o.Requests, before.Requests)}
}

// Failed summarises the outcomes that are not "ok", e.g.
// "requests: 12× connection refused; streams: 50× stream cut", and the
// totals.
func (o Outcomes) Failed() string {
	part := func(kind string, m map[string]int) string {
		var keys []string
		total := 0
		for k, v := range m {
			total += v
			if k != "ok" {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			return fmt.Sprintf("%s: 0 of %d", kind, total)
		}
		sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || (m[keys[i]] == m[keys[j]] && keys[i] < keys[j]) })
		items := make([]string, len(keys))
		failed := 0
		for i, k := range keys {
			items[i] = fmt.Sprintf("%d× %s", m[k], k)
			failed += m[k]
		}
		return fmt.Sprintf("%s: %d of %d (%s)", kind, failed, total, strings.Join(items, ", "))
	}
	return part("requests", o.Requests) + "; " + part("streams", o.Streams)
}

// Total is the number of outcomes of a kind.
func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
