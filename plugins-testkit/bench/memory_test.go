// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

var (
	routerMemOnce sync.Once
	routerMem     map[string][3]float64
)

// BenchmarkRouter_MemoryPerOpenStream opens 1,000 streams through a router
// in this process, in front of the fake engine run as a process of its own
// (two tokens a second into each stream, so it is not counted), and reports
// the live heap and the stacks per open stream after a collection, as
// BenchmarkNetHTTPFloor_MemoryPerOpenStream measures net/http alone (the
// client sockets of this process, about 0.3 KiB each, count in both). Two
// figures from the same run: streams taken over from net/http (the
// default), and streams kept on their net/http handlers
// (Config.KeepStreamsOnNetHTTP, the router as it was before the take-over).
func BenchmarkRouter_MemoryPerOpenStream(b *testing.B) {
	routerMemOnce.Do(func() {
		direct := startFakeProcess(b, "--token-rate", "2", "--tokens", "100000", "--max-running", "2200")
		routerMem = map[string][3]float64{}
		for _, mode := range []struct {
			name string
			keep bool
		}{{"taken-over", false}, {"on-net-http", true}} {
			routerMem[mode.name] = openStreamsMemory(b, direct, mode.keep)
		}
	})
	for i := 0; i < b.N; i++ {
	}
	for _, k := range []string{"taken-over", "on-net-http"} {
		m := routerMem[k]
		b.ReportMetric(m[0], k+"-heap+stack-KiB/stream")
		b.ReportMetric(m[1], k+"-stack-KiB/stream")
		b.ReportMetric(m[0]-m[1], k+"-heap-KiB/stream")
		b.ReportMetric(m[2], k+"-goroutines/stream")
	}
	if base := routerMem["on-net-http"][0]; base > 0 {
		b.ReportMetric(routerMem["taken-over"][0]/base, "ratio")
	}
}

// openStreamsMemory opens 1,000 streams through a fresh router in front of
// the engine at direct and returns the growth per stream: heap plus
// stacks (KiB), stacks (KiB), goroutines.
func openStreamsMemory(b *testing.B, direct string, keep bool) [3]float64 {
	const streams = 1000
	spec := &structs.Deployment{Name: "m", API: structs.APIChat, Routes: []string{"m"}, Instances: 1}
	spec.EngineConfig.MaxConcurrentRequests = 2 * streams
	spec.Limits.MaxWaiting = 4096
	route := &routes.Route{Deployment: "m", API: structs.APIChat, Routes: []string{"m"}, Desired: structs.DesiredRunning, Spec: spec, Instances: 1,
		Ready: []*routes.Target{{Instance: "m/0", Generation: 1, Endpoint: structs.EngineEndpoint{BaseURL: direct, ChatPath: "/v1/chat/completions", ServedName: "m"}}}}
	rt := router.New(router.Config{Lifecycle: newLC(route), MaxWaitingTotal: 4096, KeepStreamsOnNetHTTP: keep})
	defer rt.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", rt.ChatCompletions)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	open := func(n int) []net.Conn {
		conns := make([]net.Conn, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 128)
		for i := range conns {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				conns[i] = openStream(b, addr, "", streamBody)
			}()
		}
		wg.Wait()
		return conns
	}
	closeAll := func(conns []net.Conn) {
		for _, c := range conns {
			c.Close()
		}
	}
	closeAll(open(64)) // warm up
	before := liveMemory()
	conns := open(streams)
	if !keep {
		// A stream is taken over at its first flush after
		// router.DefaultTakeOverAfter: its next token.
		deadline := time.Now().Add(30 * time.Second)
		for rt.Open() < streams && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	after := liveMemory()
	closeAll(conns)
	return [3]float64{
		(after[0] + after[1] - before[0] - before[1]) / streams / 1024,
		(after[1] - before[1]) / streams / 1024,
		(after[2] - before[2]) / streams,
	}
}

// startFakeProcess runs the fake engine binary on a free loopback port
// until the benchmark ends and returns its base URL.
func startFakeProcess(b *testing.B, args ...string) string {
	b.Helper()
	_, fake := harness.Binaries(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(fake, append([]string{"serve", "--served-name", "m", "--port", strconv.Itoa(port)}, args...)...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := client.Get(base + "/fake/stats")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base
			}
		}
		if ctx.Err() != nil {
			b.Fatalf("the fake engine did not answer on %s: %v", base, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
