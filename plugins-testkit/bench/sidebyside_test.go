// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/ports"
)

// BenchmarkSideBySide measures what CapyCTL costs against the floor of a
// Go proxy, in one run, as issue 31 states it: three targets, each a
// process of its own in front of its own copy of the same fake OpenAI
// engine (64 chunks a stream, answers of 8 tokens):
//
//   - the bare proxy: net/http/httputil.ReverseProxy that reads the request
//     body first and flushes every write (FlushInterval -1), nothing else;
//   - a standalone role;
//   - a server relaying to a host (the engine runs on the host).
//
// With CAPYCTL_BENCH_BASELINE=<dir>, <dir>/capyctl runs beside this build
// as a standalone role and as a server relaying to a host of its own
// ("baseline", "baseline relay"), for before and after in one run.
//
// The load generator is closed-loop over keep-alive connections (one per
// client, a new one only when the answer closes it): 1 s of warm-up, then
// 5 s measured; every figure three times, the targets interleaved in each
// repetition, and the median printed with its ratio to the bare proxy's.
// CPU per request is read from /proc/<pid>/stat: of the bare proxy's
// process; of the role and all its children (driver plugins, engine shims)
// but not its engines; of the server (and, for the reader, of the host
// behind it). Added latencies are against the same engine reached directly,
// in the same repetition.
//
// Then, where the environment allows: in front of a real llama-server
// (CAPYCTL_LLAMA_SERVER, with stories260K), 400 answers of 64 tokens at
// concurrency 4, non-streamed (the role streams from llama.cpp and
// assembles the answer); a cold start while the same load generator keeps
// the machine busy; and a server relaying 10,000 open streams of one chunk
// a second from two hosts (resident memory per stream and CPU per relayed
// chunk on the server; the hosts', engines' and client's CPU per chunk
// apart). Streams that fail to open or end early fail it.
//
// Knobs (environment): CAPYCTL_BENCH_WARMUP and CAPYCTL_BENCH_MEASURE
// (durations), CAPYCTL_BENCH_REPS, CAPYCTL_BENCH_ONLY (a comma list of
// sections: proxy, llama, cold, fleet), CAPYCTL_BENCH_LLAMA_REQUESTS,
// CAPYCTL_BENCH_FLEET_STREAMS, CAPYCTL_BENCH_FLEET_EVERY (the time between
// a stream's chunks, e.g. 1s), CAPYCTL_BENCH_COLD_SAMPLES, CAPYCTL_BENCH_LLAMA_STREAMED=0 (the
// llama-server section without its streamed half), CAPYCTL_BENCH_PERF=1 (perf stat's system
// calls and context switches per request of each target, in the proxy section). Nothing else
// is asserted: the behaviour behind
// the figures is tested elsewhere.
func BenchmarkSideBySide(b *testing.B) {
	sideOnce.Do(func() { sideLines = measureSideBySide(b) })
	for i := 0; i < b.N; i++ {
	}
	// Printed, not logged: go test cuts a benchmark's log after a few
	// lines.
	for _, l := range sideLines {
		fmt.Println(l)
	}
}

var (
	sideOnce  sync.Once
	sideLines []string
)

// sbKnobs are the benchmark's durations and sizes.
type sbKnobs struct {
	warm, measure time.Duration
	reps          int
	only          map[string]bool
	llamaN        int
	fleetStreams  int
	fleetEvery    time.Duration
	coldN         int
	perf          bool // CAPYCTL_BENCH_PERF=1: count syscalls and switches
}

func sideKnobs() sbKnobs {
	k := sbKnobs{warm: time.Second, measure: 5 * time.Second, reps: 3, llamaN: 400, fleetStreams: 10000, coldN: 7}
	if d, err := time.ParseDuration(os.Getenv("CAPYCTL_BENCH_WARMUP")); err == nil {
		k.warm = d
	}
	if d, err := time.ParseDuration(os.Getenv("CAPYCTL_BENCH_MEASURE")); err == nil && d > 0 {
		k.measure = d
	}
	if n, err := strconv.Atoi(os.Getenv("CAPYCTL_BENCH_REPS")); err == nil && n > 0 {
		k.reps = n
	}
	if n, err := strconv.Atoi(os.Getenv("CAPYCTL_BENCH_LLAMA_REQUESTS")); err == nil && n > 0 {
		k.llamaN = n
	}
	if n, err := strconv.Atoi(os.Getenv("CAPYCTL_BENCH_FLEET_STREAMS")); err == nil && n > 0 {
		k.fleetStreams = n
	}
	k.fleetEvery = time.Second
	if d, err := time.ParseDuration(os.Getenv("CAPYCTL_BENCH_FLEET_EVERY")); err == nil && d > 0 {
		k.fleetEvery = d
	}
	if n, err := strconv.Atoi(os.Getenv("CAPYCTL_BENCH_COLD_SAMPLES")); err == nil && n > 0 {
		k.coldN = n
	}
	k.perf = os.Getenv("CAPYCTL_BENCH_PERF") == "1"
	if v := os.Getenv("CAPYCTL_BENCH_ONLY"); v != "" {
		k.only = map[string]bool{}
		for _, s := range strings.Split(v, ",") {
			k.only[strings.TrimSpace(s)] = true
		}
	}
	return k
}

func (k sbKnobs) runs(section string) bool { return k.only == nil || k.only[section] }

// sbFakeArgs is the fake engine every target stands in front of: 64 chunks
// a stream, as fast as it writes them.
var sbFakeArgs = []string{"--tokens", "64", "--max-running", "256"}

const (
	sbStreamBody = `{"model":"demo","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	sbSmallBody  = `{"model":"demo","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`
)

// sbSide is one target in front of its own engine.
type sbSide struct {
	name   string
	base   string       // where the load goes
	key    string       // its API key ("" for none)
	direct string       // its engine's own base URL
	cpu    func() int64 // CPU ticks of the target's processes
	extra  func() int64 // CPU ticks of the host behind a server (nil: none)
	pid    int          // the target's (proxy, role or server) process
	tree   func() []int // the processes cpu reads
}

func measureSideBySide(b *testing.B) []string {
	k := sideKnobs()
	var out []string
	say := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	say("side by side (issue 31): warm-up %s, measured %s, %d repetitions interleaved, medians; load average at the start %s",
		k.warm, k.measure, k.reps, loadAverage())
	var roles []*harness.Role
	var bare *sbSide
	if k.runs("proxy") || k.runs("llama") || k.runs("cold") {
		var sides []*sbSide
		bare, roles, sides = startSides(b, k.runs("proxy"))
		if k.runs("proxy") {
			out = append(out, measureProxies(b, k, sides)...)
		}
	}
	if k.runs("llama") {
		out = append(out, measureLlama(b, k, roles)...)
	}
	if k.runs("cold") {
		out = append(out, measureColdUnderLoad(b, k, roles, bare)...)
	}
	if k.runs("fleet") {
		out = append(out, measureFleetScale(b, k)...)
	}
	say("load average at the end %s", loadAverage())
	return out
}

// startSides starts the bare proxy and a standalone role, each in front of
// its own fake engine (and the baseline build's role, with
// CAPYCTL_BENCH_BASELINE), and, with server, a server relaying to a host.
// roles are the standalone roles, this build's first.
func startSides(b *testing.B, server bool) (bare *sbSide, roles []*harness.Role, sides []*sbSide) {
	_, fakeBin := harness.Binaries(b)
	engURL, _ := spawnFake(b, fakeBin, "demo", sbFakeArgs...)
	proxyURL, proxyPID := startBareProxyPID(b, engURL)
	bare = &sbSide{name: "bare proxy", base: proxyURL, direct: engURL, pid: proxyPID, cpu: func() int64 { return cpuTicks(proxyPID) },
		tree: func() []int { return []int{proxyPID} }}

	r := harness.StartStandalone(b, harness.Options{})
	addFake(b, r, "fake", sbFakeArgs...)
	r.MustDeploy("demo", sbSpec("demo", "fake", 64, ""))
	eng, _ := instanceOf(b, r, "demo")
	rolePID := r.PID()
	role := &sbSide{name: "CapyCTL", base: r.InferenceURL(), key: r.Creds.APIKey, direct: eng, pid: rolePID,
		cpu: func() int64 { return treeTicks(rolePID, engineSet(r)) }, tree: func() []int { return treePIDs(rolePID, engineSet(r)) }}
	sides = []*sbSide{bare, role}
	roles = []*harness.Role{r}
	if dir := os.Getenv("CAPYCTL_BENCH_BASELINE"); dir != "" {
		// Another build of CapyCTL, measured beside this one.
		br := harness.StartStandalone(b, harness.Options{Bin: filepath.Join(dir, "capyctl")})
		addFake(b, br, "fake", sbFakeArgs...)
		br.MustDeploy("demo", sbSpec("demo", "fake", 64, ""))
		beng, _ := instanceOf(b, br, "demo")
		brPID := br.PID()
		roles = append(roles, br)
		sides = append(sides, &sbSide{name: "baseline", base: br.InferenceURL(), key: br.Creds.APIKey, direct: beng, pid: brPID,
			cpu: func() int64 { return treeTicks(brPID, engineSet(br)) }, tree: func() []int { return treePIDs(brPID, engineSet(br)) }})
	}
	if server {
		sides = append(sides, startRelay(b, "server relay", ""))
		if dir := os.Getenv("CAPYCTL_BENCH_BASELINE"); dir != "" {
			sides = append(sides, startRelay(b, "baseline relay", filepath.Join(dir, "capyctl")))
		}
	}
	return bare, roles, sides
}

// startRelay starts a server relaying to a host that runs the fake engine
// (bin: the capyctl of both, "" for this build's).
func startRelay(b *testing.B, name, bin string) *sbSide {
	srv := harness.StartServer(b, harness.Options{Bin: bin})
	host := harness.StartHost(b, srv, harness.HostOptions{Options: harness.Options{Bin: bin}, Name: "gpu-a", GPU: harness.SimGPU{DeviceMemory: "80GiB"}})
	waitHosts(b, srv, 1)
	addFake(b, srv, "fake", sbFakeArgs...)
	host.WriteFile("models/demo/README", "fake model\n")
	waitEngineOnHosts(b, srv, "fake")
	srv.MustDeploy("demo", sbSpec("demo", "fake", 64, ""))
	heng, _ := instanceOf(b, host, "demo")
	srvPID, hostPID := srv.PID(), host.PID()
	return &sbSide{name: name, base: srv.InferenceURL(), key: srv.Creds.APIKey, direct: heng, pid: srvPID,
		cpu:   func() int64 { return treeTicks(srvPID, nil) },
		tree:  func() []int { return treePIDs(srvPID, nil) },
		extra: func() int64 { return treeTicks(hostPID, engineSet(host)) }}
}

// addFake registers the fake engine (without an engine key, so that the
// benchmark reaches it directly) as a custom engine that stops a
// non-streamed request on a hang-up.
func addFake(b *testing.B, r *harness.Role, name string, args ...string) {
	m := strings.Replace(harness.FakeManifest(args...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
	m += "non_streamed_hangup = \"stops\"\n"
	f := r.WriteFile("manifests/"+name+".hcl", m)
	if out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", name, "--manifest", f, "--yes"); code != 0 {
		b.Fatalf("engine add %s: %d %s %s", name, code, out, errOut)
	}
}

// sbSpec is a deployment of engine with places places, pinned to host
// when not "".
func sbSpec(name, engine string, places int, host string) string {
	pin := ""
	if host != "" {
		pin = fmt.Sprintf("  placement {\n    hosts = [%q]\n  }\n", host)
	}
	return fmt.Sprintf("deployment %q {\n  engine = %q\n%s  model {\n    path = %q\n  }\n  engine_config {\n    max_concurrent_requests = %d\n  }\n}\n",
		name, engine, pin, name, places)
}

// instanceOf is the base URL and pid of a deployment's first instance on
// role r.
func instanceOf(b *testing.B, r *harness.Role, dep string) (string, int) {
	var url string
	var pid int
	waitFor(b, 30*time.Second, "instance of "+dep, func() bool {
		st, err := r.Mgmt.Deployment(context.Background(), dep)
		if err != nil || len(st.Instances) == 0 || st.Instances[0].Port == 0 {
			return false
		}
		url, pid = "http://127.0.0.1:"+strconv.Itoa(st.Instances[0].Port), st.Instances[0].PID
		return true
	})
	return url, pid
}

// engineSet is the pids of every engine a role runs now (not counted as
// the role's own CPU).
func engineSet(r *harness.Role) map[int]bool {
	set := map[int]bool{}
	ctx := context.Background()
	deps, err := r.Mgmt.Deployments(ctx)
	if err != nil {
		return set
	}
	for _, d := range deps {
		for _, in := range d.Instances {
			if in.PID > 0 {
				set[in.PID] = true
			}
		}
	}
	return set
}

func waitHosts(b *testing.B, srv *harness.Role, n int) {
	waitFor(b, 60*time.Second, "hosts ready", func() bool {
		out, _, _ := srv.CLI("list", "hosts")
		return strings.Count(out, "ready") >= n
	})
}

func waitEngineOnHosts(b *testing.B, srv *harness.Role, engine string) {
	waitFor(b, 30*time.Second, "the server lists the engine", func() bool {
		out, _, _ := srv.CLI("list", "hosts")
		return strings.Contains(out, engine)
	})
}

// waitFor polls cond until it holds, failing the benchmark after limit.
func waitFor(b *testing.B, limit time.Duration, what string, cond func() bool) {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sbFigure is one line of the table.
type sbFigure struct {
	name   string
	stream bool
	conc   int
	body   string
}

var sbFigures = []sbFigure{
	{"64-chunk stream, c=1", true, 1, sbStreamBody},
	{"64-chunk stream, c=32", true, 32, sbStreamBody},
	{"8-token answer, c=1", false, 1, sbSmallBody},
	{"8-token answer, c=32", false, 32, sbSmallBody},
}

// sbResult gathers one figure's repetitions for one side.
type sbResult struct {
	cpu, extra, rate, p50, p99, first50, added, addedFirst []float64
	// syscalls and switches per request of the target's processes
	// (CAPYCTL_BENCH_PERF=1)
	sys, cs []float64
	errs    int
}

func measureProxies(b *testing.B, k sbKnobs, sides []*sbSide) []string {
	res := map[string]map[string]*sbResult{}
	for _, f := range sbFigures {
		res[f.name] = map[string]*sbResult{}
		for _, s := range sides {
			res[f.name][s.name] = &sbResult{}
		}
	}
	for rep := 0; rep < k.reps; rep++ {
		for _, f := range sbFigures {
			for _, s := range sides {
				r := res[f.name][s.name]
				var direct *sbLoad
				if f.conc == 1 {
					direct = sbRun(b, s.direct, "", f, k, nil, nil)
				}
				var pids func() []int
				if k.perf {
					pids = s.tree
				}
				l := sbRunPerf(b, s.base, s.key, f, k, s.cpu, s.extra, pids)
				r.errs += l.failed()
				if l.perf {
					r.sys = append(r.sys, float64(l.sys)/float64(max(l.n, 1)))
					r.cs = append(r.cs, float64(l.cs)/float64(max(l.n, 1)))
				}
				r.cpu = append(r.cpu, ticksPer(l.cpu, l.n))
				r.extra = append(r.extra, ticksPer(l.extra, l.n))
				r.rate = append(r.rate, float64(l.n)/l.window.Seconds())
				r.p50 = append(r.p50, pct(l.lat, .5))
				r.p99 = append(r.p99, pct(l.lat, .99))
				r.first50 = append(r.first50, pct(l.first, .5))
				if direct != nil {
					r.added = append(r.added, pct(l.lat, .5)-pct(direct.lat, .5))
					r.addedFirst = append(r.addedFirst, pct(l.first, .5)-pct(direct.first, .5))
				}
			}
		}
	}
	var out []string
	say := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	get := func(fig, side string) *sbResult { return res[fig][side] }
	say("")
	head, rule := "| figure | bare proxy |", "|---|---|"
	for _, s := range sides[1:] {
		head += " " + s.name + " | ratio |"
		rule += "---|---|"
	}
	say("%s target |", head)
	say("%s---|", rule)
	row := func(name, unit string, pick func(*sbResult) []float64, target string, format string) {
		fig := name[:strings.Index(name, ":")]
		bv := median(pick(get(fig, "bare proxy")))
		line := fmt.Sprintf("| %s | "+format+" %s |", name, bv, unit)
		for _, s := range sides[1:] {
			v := median(pick(get(fig, s.name)))
			line += fmt.Sprintf(" "+format+" %s | %.2f |", v, unit, ratio(v, bv))
		}
		out = append(out, line+" "+target+" |")
	}
	cpu := func(r *sbResult) []float64 { return r.cpu }
	row("64-chunk stream, c=1: CPU per stream", "µs", cpu, "≤ 1.0 (server ≤ 1.2)", "%.0f")
	row("64-chunk stream, c=1: last chunk p99", "ms", func(r *sbResult) []float64 { return r.p99 }, "≤ 1.2", "%.3f")
	row("64-chunk stream, c=1: added first chunk p50 vs direct", "ms", func(r *sbResult) []float64 { return r.addedFirst }, "≤ 1.2", "%.3f")
	row("64-chunk stream, c=32: streams/s", "/s", func(r *sbResult) []float64 { return r.rate }, "≥ 1.0", "%.0f")
	row("64-chunk stream, c=32: CPU per stream", "µs", cpu, "≤ 1.0 (server ≤ 1.2)", "%.0f")
	row("8-token answer, c=1: added p50 vs direct", "ms", func(r *sbResult) []float64 { return r.added }, "≤ 1.2", "%.3f")
	row("8-token answer, c=1: CPU per request", "µs", cpu, "≤ 1.0", "%.0f")
	row("8-token answer, c=32: requests/s", "/s", func(r *sbResult) []float64 { return r.rate }, "≥ 1.0", "%.0f")
	row("8-token answer, c=32: CPU per request", "µs", cpu, "≤ 1.0", "%.0f")
	if k.perf {
		say("")
		for _, f := range sbFigures {
			line := f.name + ": syscalls, context switches per request (perf stat, the target's processes):"
			for _, s := range sides {
				if r := get(f.name, s.name); len(r.sys) > 0 {
					line += fmt.Sprintf(" %s %.1f, %.2f;", s.name, median(r.sys), median(r.cs))
				}
			}
			say("%s", line)
		}
	}
	say("")
	for _, f := range sbFigures {
		line := f.name + ": last chunk or answer p50, first chunk p50:"
		for _, s := range sides {
			r := get(f.name, s.name)
			line += fmt.Sprintf(" %s %.3f, %.3f ms;", s.name, median(r.p50), median(r.first50))
			if s.extra != nil {
				line += fmt.Sprintf(" the host behind the server %.0f µs of CPU per request;", median(r.extra))
			}
		}
		errs := 0
		for _, s := range sides {
			errs += get(f.name, s.name).errs
		}
		if errs > 0 {
			line += fmt.Sprintf("; %d failed answers", errs)
		}
		say("%s", line)
	}
	return out
}

// sbLoad is what one closed-loop run saw in its measured window.
type sbLoad struct {
	n      int             // answers completed in the window
	lat    []time.Duration // to the end of the answer ([DONE] for a stream), started and ended in the window
	first  []time.Duration // to the first content (streams)
	window time.Duration
	cpu    int64 // ticks of the target's processes in the window
	extra  int64
	// perf: sys and cs were counted (syscalls and context switches of
	// the target's processes in the window)
	perf    bool
	sys, cs int64
	errs    map[string]int
}

func (l *sbLoad) failed() int {
	n := 0
	for _, v := range l.errs {
		n += v
	}
	return n
}

// sbRun runs f's closed loop against base: warm-up, then the measured
// window, reading cpu and extra at its edges.
func sbRun(b *testing.B, base, key string, f sbFigure, k sbKnobs, cpu, extra func() int64) *sbLoad {
	return sbRunPerf(b, base, key, f, k, cpu, extra, nil)
}

// sbRunPerf is sbRun that also counts, with perf stat, the syscalls and
// context switches of the processes pids names at the window's start.
func sbRunPerf(b *testing.B, base, key string, f sbFigure, k sbKnobs, cpu, extra func() int64, pids func() []int) *sbLoad {
	res := &sbLoad{errs: map[string]int{}}
	var mu sync.Mutex
	var stop atomic.Bool
	var t0, t1 atomic.Int64 // the window, unix nanoseconds (0: not yet)
	var wg sync.WaitGroup
	addr := strings.TrimPrefix(base, "http://")
	for w := 0; w < f.conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newSBClient(addr, key, f.body)
			defer c.close()
			for !stop.Load() {
				start := time.Now()
				first, last, err := c.do(f.stream)
				end := start.Add(last)
				a, z := t0.Load(), t1.Load()
				in := a != 0 && end.UnixNano() > a && (z == 0 || end.UnixNano() <= z)
				if !in {
					continue
				}
				mu.Lock()
				if err != nil {
					res.errs[err.Error()]++
				} else {
					res.n++
					if start.UnixNano() >= a {
						res.lat = append(res.lat, last)
						if f.stream {
							res.first = append(res.first, first)
						}
					}
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(k.warm)
	var c0, e0 int64
	if cpu != nil {
		c0 = cpu()
	}
	if extra != nil {
		e0 = extra()
	}
	var counter *perfStat
	if pids != nil {
		counter = startPerfStat(pids())
	}
	start := time.Now()
	t0.Store(start.UnixNano())
	time.Sleep(k.measure)
	end := time.Now()
	t1.Store(end.UnixNano())
	if counter != nil {
		res.sys, res.cs, res.perf = counter.stop()
	}
	if cpu != nil {
		res.cpu = cpu() - c0
	}
	if extra != nil {
		res.extra = extra() - e0
	}
	res.window = end.Sub(start)
	stop.Store(true)
	wg.Wait()
	return res
}

// sbClient is one closed-loop client: one keep-alive connection, its
// request written in one piece, the answer read as it arrives.
type sbClient struct {
	addr  string
	req   []byte
	conn  net.Conn
	br    *bufio.Reader
	lines *bufio.Reader
}

func newSBClient(addr, key, body string) *sbClient {
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, auth, len(body), body)
	return &sbClient{addr: addr, req: []byte(req), br: bufio.NewReaderSize(nil, 16<<10), lines: bufio.NewReaderSize(nil, 64<<10)}
}

func (c *sbClient) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

var (
	sbDone    = []byte("data: [DONE]")
	sbContent = []byte(`"content":"`)
	sbEmpty   = []byte(`"content":""`)
)

// do sends the request and reads the answer: the time to its first
// content (streams) and to its end.
func (c *sbClient) do(stream bool) (first, last time.Duration, err error) {
	start := time.Now()
	var resp *http.Response
	for attempt := 0; ; attempt++ {
		reused := c.conn != nil
		if c.conn == nil {
			conn, derr := net.Dial("tcp", c.addr)
			if derr != nil {
				return 0, time.Since(start), errors.New("dial")
			}
			c.conn = conn
			c.br.Reset(conn)
		}
		_, err = c.conn.Write(c.req)
		if err == nil {
			resp, err = http.ReadResponse(c.br, nil)
		}
		if err == nil {
			break
		}
		c.close()
		if !reused || attempt > 0 {
			return 0, time.Since(start), errors.New("transport")
		}
	}
	defer func() {
		resp.Body.Close()
		if resp.Close || err != nil {
			c.close()
		}
	}()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, time.Since(start), errors.New(strconv.Itoa(resp.StatusCode))
	}
	if !stream {
		if _, cerr := io.Copy(io.Discard, resp.Body); cerr != nil {
			return 0, time.Since(start), errors.New("body")
		}
		return 0, time.Since(start), nil
	}
	c.lines.Reset(resp.Body)
	done := false
	for {
		line, rerr := c.lines.ReadSlice('\n')
		switch {
		case bytes.HasPrefix(line, sbDone):
			last, done = time.Since(start), true
		case first == 0 && bytes.Contains(line, sbContent) && !bytes.Contains(line, sbEmpty):
			first = time.Since(start)
		}
		if rerr != nil {
			if rerr == bufio.ErrBufferFull {
				continue
			}
			break
		}
	}
	if !done {
		return 0, time.Since(start), errors.New("truncated")
	}
	return first, last, nil
}

// treeTicks is the CPU ticks of root and every process below it, leaving
// out the processes in skip and theirs.
func treeTicks(root int, skip map[int]bool) int64 {
	var sum int64
	for _, t := range procTree(root, skip) {
		sum += t
	}
	return sum
}

// procTree is the CPU ticks of root and of every process below it by pid,
// leaving out the processes in skip and theirs.
func procTree(root int, skip map[int]bool) map[int]int64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	ticks := map[int]int64{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		children[ppid] = append(children[ppid], pid)
		ticks[pid] = u + st
	}
	out := map[int]int64{}
	var walk func(int)
	walk = func(pid int) {
		if skip[pid] {
			return
		}
		out[pid] = ticks[pid]
		for _, c := range children[pid] {
			walk(c)
		}
	}
	walk(root)
	return out
}

// treeShares says which processes of a tree spent the ticks between
// before and after (procTree), per request, the largest first: each as
// its first three arguments.
func treeShares(before, after map[int]int64, n int) string {
	type share struct {
		name string
		us   float64
	}
	var shares []share
	for pid, t := range after {
		d := t - before[pid]
		if d <= 0 {
			continue
		}
		name := strconv.Itoa(pid)
		if data, err := os.ReadFile("/proc/" + name + "/cmdline"); err == nil {
			args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
			args[0] = filepath.Base(args[0])
			name = strings.Join(args[:min(3, len(args))], " ")
		}
		shares = append(shares, share{name, ticksPer(d, n)})
	}
	sort.Slice(shares, func(i, j int) bool { return shares[i].us > shares[j].us })
	var parts []string
	for _, s := range shares {
		parts = append(parts, fmt.Sprintf("%s %.0f µs", s.name, s.us))
	}
	return strings.Join(parts, "; ")
}

// treePIDs is root and every process below it, leaving out the processes
// in skip and theirs.
func treePIDs(root int, skip map[int]bool) []int {
	var out []int
	for pid := range procTree(root, skip) {
		out = append(out, pid)
	}
	return out
}

// perfStat is a perf stat counting syscalls and context switches of some
// processes.
type perfStat struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// startPerfStat starts counting (nil when perf cannot start).
func startPerfStat(pids []int) *perfStat {
	if len(pids) == 0 {
		return nil
	}
	list := make([]string, len(pids))
	for i, p := range pids {
		list[i] = strconv.Itoa(p)
	}
	p := &perfStat{}
	p.cmd = exec.Command("perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter,context-switches", "-p", strings.Join(list, ","))
	p.cmd.Stderr = &p.out
	if err := p.cmd.Start(); err != nil {
		return nil
	}
	time.Sleep(50 * time.Millisecond) // perf attaches
	return p
}

// stop ends the count and returns it (ok false: perf counted nothing).
func (p *perfStat) stop() (sys, cs int64, ok bool) {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	_ = p.cmd.Wait()
	for _, line := range strings.Split(p.out.String(), "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch f[2] {
		case "raw_syscalls:sys_enter":
			sys, ok = v, true
		case "context-switches":
			cs = v
		}
	}
	return sys, cs, ok
}

// loadAverage is /proc/loadavg's first three figures.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// measureLlama is the roles against the bare proxy in front of a real
// llama-server (CAPYCTL_LLAMA_SERVER) serving stories260K: answers of 64
// tokens at concurrency 4, non-streamed and streamed; each target has its
// own llama-server.
func measureLlama(b *testing.B, k sbKnobs, roles []*harness.Role) []string {
	bin := os.Getenv("CAPYCTL_LLAMA_SERVER")
	if bin == "" {
		return []string{"", "llama-server: skipped (set CAPYCTL_LLAMA_SERVER to a llama-server binary)"}
	}
	model := filepath.Join(harnessModels(), "stories260K.gguf")
	if _, err := os.Stat(model); err != nil {
		model = harness.StoriesGGUF()
	}
	// The bare proxy's own llama-server, started with the options the
	// driver renders.
	port := ports.Lease(b)
	cmd := exec.Command(bin, "--model", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--alias", "stories",
		"--ctx-size", "4096", "--parallel", "4", "--n-gpu-layers", "0", "--metrics", "--slots", "--no-context-shift", "--no-webui")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	engURL := "http://127.0.0.1:" + strconv.Itoa(port)
	waitFor(b, 60*time.Second, "llama-server ready", func() bool {
		resp, err := client.Get(engURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	proxyURL, proxyPID := startBareProxyPID(b, engURL)
	type target struct {
		name, base, key string
		cpu             func() int64
		tree            func() map[int]int64 // a role's processes (nil for the bare proxy)
	}
	targets := []target{{name: "bare proxy", base: proxyURL, cpu: func() int64 { return cpuTicks(proxyPID) }}}
	data, err := os.ReadFile(model)
	if err != nil {
		b.Fatal(err)
	}
	spec := "deployment \"stories\" {\n  engine = \"llama\"\n  model {\n    path = \"stories\"\n  }\n  engine_config {\n    max_concurrent_requests = 4\n    context_length = 1024\n    llamacpp {\n      n_gpu_layers = 0\n    }\n  }\n}\n"
	for i, r := range roles {
		// The role's: the llama.cpp driver runs it.
		if out, errOut, code := r.CLI("engine", "add", bin, "--name", "llama", "--yes"); code != 0 {
			b.Fatalf("engine add llama-server: %d %s %s", code, out, errOut)
		}
		r.WriteFile("models/stories/stories260K.gguf", string(data))
		if out, errOut, code := r.DeployFile("stories", spec, "--activate", "--wait"); code != 0 {
			b.Fatalf("deploy stories: %d %s %s", code, out, errOut)
		}
		name := "CapyCTL"
		if i > 0 {
			name = "baseline"
		}
		pid := r.PID()
		targets = append(targets, target{name: name, base: r.InferenceURL(), key: r.Creds.APIKey,
			cpu:  func() int64 { return treeTicks(pid, engineSet(r)) },
			tree: func() map[int]int64 { return procTree(pid, engineSet(r)) }})
	}
	var out []string
	say := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	say("")
	say("llama-server (%s, stories260K), concurrency 4, %d answers of 64 tokens a run, %d runs interleaved, medians; CPU of the bare proxy, of the role and its children (not llama-server):",
		filepath.Base(bin), k.llamaN, k.reps)
	kinds := []bool{false, true}
	if os.Getenv("CAPYCTL_BENCH_LLAMA_STREAMED") == "0" {
		kinds = kinds[:1]
	}
	for _, stream := range kinds {
		body := fmt.Sprintf(`{"model":"stories","stream":%v,"max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"Once upon a time"}]}`, stream)
		cpu := make([][]float64, len(targets))
		p50 := make([][]float64, len(targets))
		errs := make([]int, len(targets))
		shares := make([]string, len(targets))
		for rep := 0; rep < k.reps; rep++ {
			for i, t := range targets {
				var before map[int]int64
				if rep == 0 && t.tree != nil {
					before = t.tree()
				}
				l := sbCount(b, t.base, t.key, body, stream, 4, k.llamaN, t.cpu)
				if before != nil {
					shares[i] = treeShares(before, t.tree(), l.n)
				}
				cpu[i] = append(cpu[i], ticksPer(l.cpu, l.n))
				p50[i] = append(p50[i], pct(l.lat, .5))
				errs[i] += l.failed()
			}
		}
		kind := "non-streamed"
		if stream {
			kind = "streamed"
		}
		line := fmt.Sprintf("| llama-server, c=4, %s: CPU per request | %.0f µs |", kind, median(cpu[0]))
		lat := fmt.Sprintf("  %s answer p50:", kind)
		for i, t := range targets {
			if i > 0 {
				line += fmt.Sprintf(" %s %.0f µs | %.2f |", t.name, median(cpu[i]), ratio(median(cpu[i]), median(cpu[0])))
			}
			lat += fmt.Sprintf(" %s %.1f ms (%d failed);", t.name, median(p50[i]), errs[i])
		}
		if !stream {
			line += " ≤ 2.0 |"
		} else {
			line += " |"
		}
		say("%s", line)
		say("%s", lat)
		for i, t := range targets {
			if shares[i] != "" {
				say("  %s, %s, where the CPU went in the first run, per request: %s", t.name, kind, shares[i])
			}
		}
	}
	for _, r := range roles {
		// Stopped here: a role leaves its engines running when it exits.
		_, _, _ = r.CLI("stop", "deployment", "stories", "--wait")
	}
	return out
}

// harnessModels is where the shared tiny models are, if anywhere.
func harnessModels() string {
	if d := os.Getenv("CAPYCTL_MODELS_DIR"); d != "" {
		return d
	}
	return "/work/shared/models"
}

// sbCount sends n requests with conc closed-loop clients and reads cpu
// before and after.
func sbCount(b *testing.B, base, key, body string, stream bool, conc, n int, cpu func() int64) *sbLoad {
	res := &sbLoad{errs: map[string]int{}}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	addr := strings.TrimPrefix(base, "http://")
	c0 := cpu()
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newSBClient(addr, key, body)
			defer c.close()
			for next.Add(1) <= int64(n) {
				_, last, err := c.do(stream)
				mu.Lock()
				if err != nil {
					res.errs[err.Error()]++
				} else {
					res.n++
					res.lat = append(res.lat, last)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.window = time.Since(start)
	res.cpu = cpu() - c0
	return res
}

// measureColdUnderLoad is CapyCTL's own share of a cold start while the
// load generator keeps the machine busy (32 clients against the bare
// proxy): a request to a parked deployment whose engine needs 30 ms
// before it listens, against the same engine started by hand and polled
// every half millisecond, p50 of seven each (CAPYCTL_BENCH_COLD_SAMPLES);
// with a baseline build, its role's cold requests are interleaved with this
// build's, each going first in turn.
func measureColdUnderLoad(b *testing.B, k sbKnobs, roles []*harness.Role, bare *sbSide) []string {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newSBClient(strings.TrimPrefix(bare.base, "http://"), "", sbSmallBody)
			defer c.close()
			for !stop.Load() {
				_, _, _ = c.do(false)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	time.Sleep(k.warm)
	own, colds := coldStartN(b, roles, k.coldN)
	var out []string
	for i, cold := range colds {
		name := "CapyCTL"
		if i > 0 {
			name = "baseline"
		}
		out = append(out, fmt.Sprintf("cold start under load (32 clients on the bare proxy, load average %s), %s: the engine alone %.1f ms, a cold request through CapyCTL %.1f ms, CapyCTL's own share %.1f ms (target < 20)",
			loadAverage(), name, own, cold, cold-own))
	}
	return append([]string{""}, out...)
}

// measureFleetScale opens streams through a server to two hosts (half on
// each), each carrying one chunk every fleetEvery (1 s), and reads the
// server's resident memory per open stream and CPU per relayed chunk, and
// what the producers (the hosts, their engines, the client) spent per
// chunk. The figure is the relay's only while the producers keep up: the
// run says whether they did (a server that relays a few hundred chunks a
// second spreads its fixed costs over too few of them).
func measureFleetScale(b *testing.B, k sbKnobs) []string {
	n, every := k.fleetStreams, k.fleetEvery
	// More open streams than a listener's default cap of connections.
	srv := harness.StartServer(b, harness.Options{Args: []string{"--set", "listener.max_connections=0"}})
	hosts := []*harness.Role{
		harness.StartHost(b, srv, harness.HostOptions{Name: "gpu-a", GPU: harness.SimGPU{DeviceMemory: "80GiB"}}),
		harness.StartHost(b, srv, harness.HostOptions{Name: "gpu-b", GPU: harness.SimGPU{DeviceMemory: "80GiB"}}),
	}
	waitHosts(b, srv, 2)
	// A deployment's instance takes at most 1,024 requests at once: each
	// host runs as many instances of 1,000 places as its half needs.
	const places = 1000
	per := n / 2
	// A tenth to spare: the warm-up's streams may still hold places.
	instances := (per + per/10 + places - 1) / places
	rate := strconv.FormatFloat(1/every.Seconds(), 'g', -1, 64)
	// The streams trickle; the driver's readiness probe (8 tokens, not
	// streamed) is answered at once.
	// As many tokens as 15 minutes of the run need, no more: an engine
	// holds each stream's answer whole (100,000 tokens a stream were
	// 1.8 GiB in each of the 12 engines).
	tokens := strconv.Itoa(int(15*time.Minute/every) + 16)
	addFake(b, srv, "trickle", "--stream-token-rate", rate, "--tokens", tokens, "--max-running", strconv.Itoa(places+100))
	for i, h := range hosts {
		dep := []string{"a", "b"}[i]
		h.WriteFile("models/"+dep+"/README", "fake model\n")
	}
	waitEngineOnHosts(b, srv, "trickle")
	for _, dep := range []string{"a", "b"} {
		spec := strings.Replace(sbSpec(dep, "trickle", places, "gpu-"+dep), "  model {", fmt.Sprintf("  instances = %d\n  model {", instances), 1)
		srv.MustDeploy(dep, spec)
	}
	body := func(dep string) string {
		return strings.Replace(sbStreamBody, `"model":"demo"`, `"model":"`+dep+`"`, 1)
	}
	addr := srv.Info.Inference
	// Warm up, then measure the server idle.
	for i := 0; i < 20; i++ {
		for _, dep := range []string{"a", "b"} {
			c, err := openFleetStream(addr, srv.Creds.APIKey, body(dep))
			if err != nil {
				b.Fatalf("warm-up stream: %v", err)
			}
			c.Close()
		}
	}
	time.Sleep(500 * time.Millisecond)
	srvSetup := &roleSetup{r: srv}
	rss0, m0 := vmRSS(b, srv.PID()), srvSetup.scrape(b)
	var chunks atomic.Int64
	var mu sync.Mutex
	failed := map[string]int{}
	conns := openStreams(n, 64, func() net.Conn {
		dep := "a"
		if chunks.Add(1)%2 == 0 {
			dep = "b"
		}
		c, err := openFleetStream(addr, srv.Creds.APIKey, body(dep))
		if err != nil {
			mu.Lock()
			failed[err.Error()]++
			mu.Unlock()
		}
		return c
	})
	conns = slices.DeleteFunc(conns, func(c net.Conn) bool { return c == nil })
	if len(failed) > 0 {
		// Reported, not fatal here: the figure below still says what the
		// streams that opened cost.
		for why, times := range failed {
			b.Errorf("%d of %d streams did not open: %s", times, n, why)
		}
	}
	chunks.Store(0)
	var broke atomic.Int64 // streams that ended before the client closed them
	var lastMu sync.Mutex
	var lastWords string // what the first of them read last, and why it ended
	var closing atomic.Bool
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func(c net.Conn) {
			defer wg.Done()
			buf := make([]byte, 2048)
			for {
				m, err := c.Read(buf)
				if m > 0 {
					chunks.Add(int64(bytes.Count(buf[:m], []byte("data: "))))
				}
				if err != nil {
					if !closing.Load() && broke.Add(1) == 1 {
						lastMu.Lock()
						lastWords = fmt.Sprintf("%q, then %v", buf[:m], err)
						lastMu.Unlock()
					}
					return
				}
			}
		}(c)
	}
	// Let every stream settle into its chunk each fleetEvery, then measure
	// over whole periods: each stream carries as many chunks in any of
	// them, wherever its ticks fall.
	time.Sleep(every + time.Second)
	window := every * time.Duration((k.measure+every-1)/every)
	rss1, m1 := vmRSS(b, srv.PID()), srvSetup.scrape(b)
	live := func(name string) float64 { return m1[name] - m0[name] }
	engines := append(slices.Collect(maps.Keys(engineSet(hosts[0]))), slices.Collect(maps.Keys(engineSet(hosts[1])))...)
	ticks := func() [4]int64 {
		var e int64
		for _, pid := range engines {
			e += treeTicks(pid, nil)
		}
		return [4]int64{treeTicks(srv.PID(), nil), treeTicks(hosts[0].PID(), engineSet(hosts[0])) + treeTicks(hosts[1].PID(), engineSet(hosts[1])), e, selfTicks()}
	}
	t0, n0 := ticks(), chunks.Load()
	start := time.Now()
	time.Sleep(window)
	t1, n1 := ticks(), chunks.Load()
	took := time.Since(start)
	closing.Store(true)
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	if m := broke.Load(); m > 0 {
		b.Errorf("%d of %d open streams ended before the client closed them (the first read %s)", m, len(conns), lastWords)
	}
	relayed := n1 - n0
	asked := float64(len(conns)) / every.Seconds()
	got := float64(relayed) / took.Seconds()
	perChunk := func(i int) float64 { return float64(t1[i]-t0[i]) * 10_000 / float64(max(relayed, 1)) }
	kept := "the producers kept up"
	if got < 0.9*asked {
		kept = "the producers did NOT keep up: the server's figure is not the relay's alone"
	}
	return []string{"", fmt.Sprintf("fleet scale: a server relaying %d open streams from two hosts, one chunk every %s each (%d engines), load average %s: %.0f chunks/s asked, %.0f relayed (%s); on the server %.1f KiB resident per stream (%.1f KiB of heap and stacks in use, %.1f goroutines) and %.1f µs of CPU per relayed chunk; producers per chunk: hosts %.1f µs, engines %.1f µs, client %.1f µs",
		len(conns), every, len(engines), loadAverage(), asked, got, kept, float64(rss1-rss0)/float64(len(conns)),
		(live("go_memstats_heap_inuse_bytes")+live("go_memstats_stack_inuse_bytes"))/1024/float64(len(conns)), live("go_goroutines")/float64(len(conns)),
		perChunk(0), perChunk(1), perChunk(2), perChunk(3))}
}

// openFleetStream starts a stream at addr with the API key and returns
// once its first event arrived (the engine's first chunk, relayed by the
// server from the host); the connection stays open. A stream that does
// not start says what came instead: the status, the error's code, or what
// the read failed with.
func openFleetStream(addr, key, body string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	br := bufio.NewReader(c)
	status := ""
	for {
		line, err := br.ReadString('\n')
		if status == "" {
			status = strings.TrimSpace(line)
		}
		if err != nil {
			c.Close()
			code := ""
			if i := strings.Index(line, `"code":"`); i >= 0 {
				code, _, _ = strings.Cut(line[i+8:], `"`)
			}
			return nil, fmt.Errorf("%q, code %q: %v", status, code, err)
		}
		if strings.HasPrefix(line, "data: ") {
			if strings.Contains(line, `"error"`) {
				c.Close()
				return nil, fmt.Errorf("%q, an error event: %s", status, strings.TrimSpace(line))
			}
			_ = c.SetReadDeadline(time.Time{})
			return c, nil
		}
	}
}

// selfTicks is this process's own CPU ticks (the benchmark's client;
// not the roles it started).
func selfTicks() int64 {
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// coldStartN is coldStart with n samples each, medians: the engine alone,
// then a cold request through each role, a different role first each time.
func coldStartN(b *testing.B, roles []*harness.Role, n int) (own float64, colds []float64) {
	args := []string{"--tokens", "4", "--startup-delay", "30ms"}
	for _, r := range roles {
		if _, err := r.Mgmt.Deployment(context.Background(), "cold"); err == nil {
			continue
		}
		m := strings.Replace(harness.FakeManifest(args...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
		f := r.WriteFile("manifests/cold.hcl", m)
		if out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", "cold", "--manifest", f, "--yes"); code != 0 {
			b.Fatalf("engine add cold: %d %s %s", code, out, errOut)
		}
		if out, errOut, code := r.Deploy("cold", harness.SimpleSpec("cold", "cold")); code != 0 {
			b.Fatalf("deploy cold: %d %s %s", code, out, errOut)
		}
	}
	var owns []time.Duration
	lats := make([][]time.Duration, len(roles))
	for i := 0; i < n; i++ {
		start := time.Now()
		_, pid := spawnFake(b, roles[0].FakeBin, "cold", args...)
		owns = append(owns, time.Since(start))
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
		for o := range roles {
			j := (o + i) % len(roles)
			r := roles[j]
			// A restart-only engine parks by stopping; the next request
			// starts it again.
			if out, errOut, code := r.CLI("park", "deployment", "cold", "--wait"); code != 0 && i > 0 {
				b.Fatalf("park cold: %d %s %s", code, out, errOut)
			}
			c := newSBClient(strings.TrimPrefix(r.InferenceURL(), "http://"), r.Creds.APIKey, `{"model":"cold","messages":[{"role":"user","content":"hi"}]}`)
			_, lat, err := c.do(false)
			c.close()
			if err != nil {
				b.Fatalf("cold request: %v", err)
			}
			lats[j] = append(lats[j], lat)
		}
	}
	sort.Slice(owns, func(i, j int) bool { return owns[i] < owns[j] })
	for _, l := range lats {
		colds = append(colds, pct(l, 0.5))
	}
	return pct(owns, 0.5), colds
}
