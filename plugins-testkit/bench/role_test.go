// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// roleSetup is a real standalone role serving deployment "demo" on the fake
// engine (no engine key, so the benchmark can reach the engine directly).
type roleSetup struct {
	r      *harness.Role
	engine string // the engine's base URL
	key    string
}

func startRole(b testing.TB, spec string, fakeArgs ...string) *roleSetup {
	b.Helper()
	r := harness.StartStandalone(b, harness.Options{})
	m := strings.Replace(harness.FakeManifest(fakeArgs...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
	f := r.WriteFile("manifests/fake.hcl", m)
	if out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", "fake", "--manifest", f, "--yes"); code != 0 {
		b.Fatalf("engine add: %d %s %s", code, out, errOut)
	}
	r.MustDeploy("demo", spec)
	st, err := r.Mgmt.Deployment(context.Background(), "demo")
	if err != nil || len(st.Instances) == 0 || st.Instances[0].Port == 0 {
		b.Fatalf("status: %v %+v", err, st)
	}
	return &roleSetup{r: r, engine: "http://127.0.0.1:" + strconv.Itoa(st.Instances[0].Port), key: r.Creds.APIKey}
}

func (s *roleSetup) post(b testing.TB, base, body string) time.Duration {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := client.Do(req)
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

// scrape reads the role's Prometheus metrics (admin token).
func (s *roleSetup) scrape(b testing.TB) map[string]float64 {
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.r.Info.Management+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+s.r.Creds.AdminToken)
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

var (
	roleC1Once sync.Once
	roleC1     [3][]time.Duration // direct, through the role, through a bare proxy
)

// BenchmarkRole_SmallAnswer_C1 is the added latency of a whole role (its
// inference listener, auth, router and ledger) for a small non-streamed
// answer at concurrency 1, against the same engine reached directly and
// through a bare Go reverse proxy run as a process of its own (the floor of
// a proxy hop between processes on this machine), requests interleaved.
// The role is measured once; later rounds report the same figures.
func BenchmarkRole_SmallAnswer_C1(b *testing.B) {
	roleC1Once.Do(func() {
		s := startRole(b, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
		bases := [3]string{s.engine, s.r.InferenceURL(), startBareProxy(b, s.engine)}
		for i := 0; i < 100; i++ {
			for _, base := range bases {
				s.post(b, base, smallBodyFor("demo"))
			}
		}
		for i := 0; i < 2000; i++ {
			for k, base := range bases {
				roleC1[k] = append(roleC1[k], s.post(b, base, smallBodyFor("demo")))
			}
		}
	})
	for i := 0; i < b.N; i++ {
	}
	report(b, roleC1[0], roleC1[1])
	d50, r50, p50 := pct(roleC1[0], .5), pct(roleC1[1], .5), pct(roleC1[2], .5)
	b.ReportMetric(p50, "bare-proxy-p50-ms")
	b.ReportMetric(p50-d50, "bare-proxy-added-p50-ms")
	b.ReportMetric(r50-p50, "role-minus-bare-proxy-p50-ms")
}

func smallBodyFor(model string) string {
	return strings.Replace(smallBody, `"model":"m"`, `"model":"`+model+`"`, 1)
}

var (
	roleHangOnce sync.Once
	roleHang     [2][]time.Duration
)

// BenchmarkRole_HangUpToEngineCancel is the time from a client's hang-up
// to the fake engine's observed cancellation, through a whole role and
// directly.
func BenchmarkRole_HangUpToEngineCancel(b *testing.B) {
	roleHangOnce.Do(func() {
		// Not --stall-after-tokens: the readiness probe must be answered.
		s := startRole(b, harness.SimpleSpec("demo", "fake"), "--token-rate", "50", "--tokens", "100000")
		body := strings.Replace(streamBody, `"model":"m"`, `"model":"demo"`, 1)
		for i := 0; i < 200; i++ {
			roleHang[0] = append(roleHang[0], s.hangUp(b, s.engine, body, ""))
			roleHang[1] = append(roleHang[1], s.hangUp(b, s.r.InferenceURL(), body, s.key))
		}
	})
	for i := 0; i < b.N; i++ {
	}
	report(b, roleHang[0], roleHang[1])
}

type engineStats struct {
	Cancelled          uint64 `json:"cancelled"`
	Running            int    `json:"running"`
	LastCancelUnixNano int64  `json:"last_cancel_unix_nano"`
}

func (s *roleSetup) stats(b testing.TB) engineStats {
	resp, err := client.Get(s.engine + "/fake/stats")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var st engineStats
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st
}

func (s *roleSetup) hangUp(b testing.TB, base, body, key string) time.Duration {
	before := s.stats(b).Cancelled
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", auth, len(body), body)
	br := bufio.NewReader(c)
	var status string
	for {
		line, err := br.ReadString('\n')
		if status == "" {
			status = strings.TrimSpace(line)
		}
		if err != nil {
			b.Fatalf("stream (%s; last %q): %v", status, line, err)
		}
		if strings.Contains(line, `"content"`) {
			break
		}
	}
	at := time.Now()
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		st := s.stats(b)
		if st.Cancelled != before && st.Running == 0 {
			return time.Duration(st.LastCancelUnixNano - at.UnixNano())
		}
		if time.Now().After(deadline) {
			b.Fatalf("the engine did not see the hang-up through %s: %+v (before %d)", base, st, before)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

var (
	roleMemOnce sync.Once
	roleMem     map[string]float64
)

// BenchmarkRole_MemoryPerOpenStream opens 1,000 streams through a role
// (the engine trickles two tokens a second into each) and reports the role's
// memory per open stream: resident memory and Go heap plus stacks (heap in
// use, so garbage not yet collected counts too), and the goroutines each
// stream holds. The fake engine is a process of its own and is not counted.
// BenchmarkNetHTTPFloor_MemoryPerOpenStream is what net/http's server alone
// holds per open stream, and BenchmarkRouter_MemoryPerOpenStream the
// router's live memory per stream, taken over from net/http or not, in one
// run.
func BenchmarkRole_MemoryPerOpenStream(b *testing.B) {
	const streams = 1000
	roleMemOnce.Do(func() {
		spec := `deployment "demo" {
  engine = "fake"
  model {
    path = "demo"
  }
  engine_config {
    max_concurrent_requests = 1024
  }
}
`
		s := startRole(b, spec, "--token-rate", "2", "--tokens", "100000", "--max-running", "1100")
		body := strings.Replace(streamBody, `"model":"m"`, `"model":"demo"`, 1)
		for i := 0; i < 20; i++ { // warm up
			c := s.open(b, body)
			c.Close()
		}
		time.Sleep(200 * time.Millisecond)
		before := s.scrape(b)
		conns := openStreams(streams, 64, func() net.Conn { return s.open(b, body) })
		// A stream is taken over at its first flush after
		// router.DefaultTakeOverAfter: its next token.
		after := s.scrape(b)
		for deadline := time.Now().Add(30 * time.Second); after["capyctl_streams_taken_over"] < streams && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			after = s.scrape(b)
		}
		if n := after[`capyctl_requests_in_flight{deployment="demo"}`]; n != streams {
			b.Fatalf("in flight %v, want %d", n, streams)
		}
		per := func(k string) float64 { return (after[k] - before[k]) / streams / 1024 }
		roleMem = map[string]float64{
			"rss-KiB/stream":        per("process_resident_memory_bytes"),
			"heap+stack-KiB/stream": per("go_memstats_heap_inuse_bytes") + per("go_memstats_stack_inuse_bytes"),
			"stack-KiB/stream":      per("go_memstats_stack_inuse_bytes"),
			"heap-KiB/stream":       per("go_memstats_heap_inuse_bytes"),
			"goroutines/stream":     (after["go_goroutines"] - before["go_goroutines"]) / streams,
		}
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < b.N; i++ {
	}
	for k, v := range roleMem {
		b.ReportMetric(v, k)
	}
}

// openStreams opens n streams, parallel at a time, and returns their
// connections once every one has its first content.
func openStreams(n, parallel int, open func() net.Conn) []net.Conn {
	conns := make([]net.Conn, 0, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c := open()
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return conns
}

// open starts a stream through the role and returns once its first
// content arrived; the connection stays open.
func (s *roleSetup) open(b testing.TB, body string) net.Conn {
	return openStream(b, s.r.Info.Inference, s.key, body)
}

// openStream starts a stream at addr (with the API key, when not empty)
// and returns once its first content arrived; the connection stays open.
func openStream(b testing.TB, addr, key, body string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", auth, len(body), body)
	// A stream that never starts fails the benchmark instead of hanging it.
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	br := bufio.NewReader(c)
	var status string
	for {
		line, err := br.ReadString('\n')
		if status == "" {
			status = strings.TrimSpace(line)
		}
		if err != nil {
			b.Fatalf("stream (%s; last %q): %v", status, line, err)
		}
		if strings.Contains(line, `"content"`) {
			_ = c.SetReadDeadline(time.Time{})
			return c
		}
	}
}
