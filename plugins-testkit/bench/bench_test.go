// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package bench measures what CapyCTL's router adds to a request, against
// a baseline measured in the same run: the same fake engine reached
// directly. In-process benchmarks put the router and the fake engine in
// this process (httptest servers); the role benchmarks run a real
// standalone role (plugins-testkit/harness) with the fake engine as a
// custom engine. `make bench` runs them; each prints its figures as
// benchmark metrics (ms, requests/s, tokens/s, KiB, and ratios).
package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// lc is a lifecycle with one ready deployment.
type lc struct{ b routes.Board }

func (l *lc) Board() *routes.Board { return &l.b }

func newLC(rs ...*routes.Route) *lc {
	l := &lc{}
	l.b.Publish(routes.NewTable(rs...))
	return l
}

func (l *lc) Activate(context.Context, string) error              { return nil }
func (l *lc) Abort(context.Context, string, string) (bool, error) { return false, nil }
func (l *lc) Load(context.Context, string) (routes.InstanceLoad, error) {
	return routes.InstanceLoad{Known: true}, nil
}
func (l *lc) InstanceRun(string) (uint64, structs.InstanceState, bool) {
	return 1, structs.StateReady, true
}
func (l *lc) RestartForSettlement(string) {}

// setup is a fake engine and a router in front of it.
type setup struct {
	eng       *fakeengine.Engine
	direct    string // the engine's base URL
	routed    string // the router's base URL
	rt        *router.Router
	directMod string
}

// benchEngine runs a fake engine serving "m" on loopback until the
// benchmark ends and returns it with its base URL.
func benchEngine(b testing.TB, cfg fakeengine.Config) (*fakeengine.Engine, string) {
	b.Helper()
	cfg.ServedName = "m"
	cfg.Stdout, cfg.Stderr = io.Discard, io.Discard
	cfg.ShutdownGrace = time.Millisecond
	e, err := fakeengine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := fakeengine.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Serve(ctx, ln); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	<-e.Ready()
	return e, "http://" + ln.Addr().String()
}

func newSetup(b testing.TB, cfg fakeengine.Config, places int) *setup {
	b.Helper()
	if cfg.MaxRunning == 0 {
		cfg.MaxRunning = 1024
	}
	e, direct := benchEngine(b, cfg)
	spec := &structs.Deployment{Name: "m", API: structs.APIChat, Routes: []string{"m"}, Instances: 1}
	spec.EngineConfig.MaxConcurrentRequests = places
	spec.Limits.MaxWaiting = 4096
	route := &routes.Route{Deployment: "m", API: structs.APIChat, Routes: []string{"m"}, Desired: structs.DesiredRunning, Spec: spec, Instances: 1,
		Ready: []*routes.Target{{Instance: "m/0", Generation: 1, Endpoint: structs.EngineEndpoint{BaseURL: direct, ChatPath: "/v1/chat/completions", ServedName: "m"}}}}
	rt := router.New(router.Config{Lifecycle: newLC(route), MaxWaitingTotal: 4096})
	b.Cleanup(rt.Close)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", rt.ChatCompletions)
	srv := httptest.NewServer(mux)
	b.Cleanup(srv.Close)
	return &setup{eng: e, direct: direct, routed: srv.URL, rt: rt}
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048, MaxIdleConns: 4096, DisableCompression: true}}

const smallBody = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
const streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`

// post sends one request and reads the whole answer.
func post(b testing.TB, base, body string) time.Duration {
	start := time.Now()
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return time.Since(start)
}

// firstContent sends a streamed request and returns the time to the first
// chunk with content, then reads the rest.
func firstContent(b testing.TB, base string) time.Duration {
	start := time.Now()
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var ttft time.Duration
	for {
		line, err := br.ReadString('\n')
		if ttft == 0 && strings.Contains(line, `"content"`) {
			ttft = time.Since(start)
		}
		if err != nil {
			break
		}
	}
	return ttft
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[min(len(s)-1, int(p*float64(len(s))))]) / float64(time.Millisecond)
}

// BenchmarkSmallAnswer_C1 is the router's added latency for a small
// non-streamed answer at concurrency 1: each iteration sends the same
// request directly and through the router.
func BenchmarkSmallAnswer_C1(b *testing.B) {
	s := newSetup(b, fakeengine.Config{Tokens: 4}, 32)
	for i := 0; i < 50; i++ { // warm the connections
		post(b, s.direct, smallBody)
		post(b, s.routed, smallBody)
	}
	var direct, routed []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, post(b, s.direct, smallBody))
		routed = append(routed, post(b, s.routed, smallBody))
	}
	b.StopTimer()
	report(b, direct, routed)
}

func report(b *testing.B, direct, routed []time.Duration) {
	d50, r50 := pct(direct, .5), pct(routed, .5)
	d99, r99 := pct(direct, .99), pct(routed, .99)
	b.ReportMetric(d50, "direct-p50-ms")
	b.ReportMetric(r50, "router-p50-ms")
	b.ReportMetric(r50-d50, "added-p50-ms")
	b.ReportMetric(d99, "direct-p99-ms")
	b.ReportMetric(r99, "router-p99-ms")
	b.ReportMetric(r99-d99, "added-p99-ms")
	if d50 > 0 {
		b.ReportMetric(r50/d50, "ratio-p50")
	}
}

// BenchmarkSmallAnswer_C32 is the same at concurrency 32: requests/s
// directly and through the router, and the latencies.
func BenchmarkSmallAnswer_C32(b *testing.B) {
	s := newSetup(b, fakeengine.Config{Tokens: 4}, 64)
	run := func(base string, n int) ([]time.Duration, float64) {
		var mu sync.Mutex
		var lat []time.Duration
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for next.Add(1) <= int64(n) {
					mine = append(mine, post(b, base, smallBody))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return lat, float64(n) / time.Since(start).Seconds()
	}
	run(s.direct, 500)
	run(s.routed, 500)
	n := max(b.N, 320)
	b.ResetTimer()
	direct, drps := run(s.direct, n)
	routed, rrps := run(s.routed, n)
	b.StopTimer()
	report(b, direct, routed)
	b.ReportMetric(drps, "direct-req/s")
	b.ReportMetric(rrps, "router-req/s")
	b.ReportMetric(rrps/drps, "ratio-req/s")
}

// BenchmarkStreamFirstToken is the time to the first content chunk of a
// stream, directly and through the router.
func BenchmarkStreamFirstToken(b *testing.B) {
	s := newSetup(b, fakeengine.Config{Tokens: 64}, 32)
	for i := 0; i < 20; i++ {
		firstContent(b, s.direct)
		firstContent(b, s.routed)
	}
	var direct, routed []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, firstContent(b, s.direct))
		routed = append(routed, firstContent(b, s.routed))
	}
	b.StopTimer()
	report(b, direct, routed)
}

// BenchmarkStreamThroughput is the most streamed tokens per second one
// stream carries, directly and through the router (the fake engine
// generates as fast as it can).
func BenchmarkStreamThroughput(b *testing.B) {
	const tokens = 20000
	s := newSetup(b, fakeengine.Config{Tokens: tokens}, 32)
	var dt, rt time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dt += post(b, s.direct, streamBody)
		rt += post(b, s.routed, streamBody)
	}
	b.StopTimer()
	d := float64(tokens*b.N) / dt.Seconds()
	r := float64(tokens*b.N) / rt.Seconds()
	b.ReportMetric(d, "direct-tok/s")
	b.ReportMetric(r, "router-tok/s")
	b.ReportMetric(r/d, "ratio")
}

// BenchmarkHangUpToEngineCancel is the time from a client's hang-up to the
// engine's observed cancellation, directly and through the router.
func BenchmarkHangUpToEngineCancel(b *testing.B) {
	s := newSetup(b, fakeengine.Config{StallAfterTokens: 1}, 1024)
	var direct, routed []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, hangUp(b, s.eng, s.direct))
		routed = append(routed, hangUp(b, s.eng, s.routed))
	}
	b.StopTimer()
	report(b, direct, routed)
}

// hangUp opens a stream, waits for its first content, closes the
// connection and returns how long the engine took to see it.
func hangUp(b testing.TB, eng *fakeengine.Engine, base string) time.Duration {
	before := eng.Stats().Cancelled
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			b.Fatalf("stream: %v", err)
		}
		if strings.Contains(line, `"content"`) {
			break
		}
	}
	at := time.Now()
	c.Close()
	for eng.Stats().Cancelled == before {
		time.Sleep(20 * time.Microsecond)
	}
	return time.Duration(eng.Stats().LastCancelUnixNano - at.UnixNano())
}

// BenchmarkNetHTTPFloor_MemoryPerOpenStream is the floor under the role's
// memory per open stream: 1,000 streams open on a bare net/http server in
// this process whose handler reads the body, answers 200 with one SSE event
// and waits for the client to go. It holds what every net/http handler
// holds for an open stream (the connection's 4 KiB reader and 4 KiB
// writer, the response's 2 KiB writer, the request, the handler's goroutine
// and the one net/http runs to notice a hang-up) and nothing of CapyCTL.
// Measured after a collection (live heap plus stacks); the client sockets
// of this process (about 0.3 KiB each) are counted too.
func BenchmarkNetHTTPFloor_MemoryPerOpenStream(b *testing.B) {
	const streams = 1000
	floorOnce.Do(func() {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"))
			_ = http.NewResponseController(w).Flush()
			<-r.Context().Done()
		}))
		defer srv.Close()
		open := func() net.Conn {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					b.Fatalf("stream: %v", err)
				}
				if strings.Contains(line, `"content"`) {
					return c
				}
			}
		}
		for i := 0; i < 20; i++ {
			open().Close()
		}
		before := liveMemory()
		conns := make([]net.Conn, 0, streams)
		for i := 0; i < streams; i++ {
			conns = append(conns, open())
		}
		after := liveMemory()
		floor = [3]float64{
			(after[0] + after[1] - before[0] - before[1]) / streams / 1024,
			(after[1] - before[1]) / streams / 1024,
			(after[2] - before[2]) / streams,
		}
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < b.N; i++ {
	}
	b.ReportMetric(floor[0], "heap+stack-KiB/stream")
	b.ReportMetric(floor[1], "stack-KiB/stream")
	b.ReportMetric(floor[2], "goroutines/stream")
}

var (
	floorOnce sync.Once
	floor     [3]float64
)

// liveMemory collects garbage and returns the live heap, the stacks and
// the goroutines.
func liveMemory() [3]float64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}, {Name: "/sched/goroutines:goroutines"}}
	metrics.Read(s)
	return [3]float64{float64(s[0].Value.Uint64()), float64(s[1].Value.Uint64()), float64(s[2].Value.Uint64())}
}
