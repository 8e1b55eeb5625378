// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// BenchmarkEnginePath is the engine path end to end, the figures of the
// "real engines at full speed" issue: a whole standalone role and a bare
// reverse-proxy process (httputil.ReverseProxy, the floor of any Go proxy
// between processes), each in front of its own instance of the same fake
// engine, measured interleaved in the same run, medians of three rounds.
// Every figure is printed with its ratio to the bare proxy's and, where the
// issue set one, its target. Nothing here is asserted: the figures are for
// the reader (make bench), the behaviour behind them is tested elsewhere.
//
// Engines, each started twice (one behind the role, one behind the proxy):
//   - fast: answers at once, stops a non-streamed request on a hang-up
//     (the role forwards such a request as it is);
//   - llama: like llama-server b4748 in front of stories260K with 4 slots:
//     2,000 tokens/s per request, closes the connection after every
//     streamed answer while advertising keep-alive (the role streams every
//     request from it, as the llama.cpp driver declares);
//   - chunks: 64 chunks per answer, for the last-chunk tail.
//
// And a cold start: an engine that needs 30 ms before it listens, started
// by the first request, against the same engine started by hand and polled
// every half millisecond.
func BenchmarkEnginePath(b *testing.B) {
	enginePathOnce.Do(func() { enginePath = measureEnginePath(b) })
	for i := 0; i < b.N; i++ {
	}
	// Printed, not logged: go test cuts a benchmark's log after a few
	// lines.
	for _, l := range enginePath {
		fmt.Println(l)
	}
}

var (
	enginePathOnce sync.Once
	enginePath     []string
)

// pathEngine is one kind of fake engine: its manifest for the role and its
// arguments when started by hand.
type pathEngine struct {
	name   string
	args   []string
	hangup string // the manifest's non_streamed_hangup
	places int
}

var pathEngines = []pathEngine{
	{name: "fast", args: []string{"--tokens", "4"}, hangup: "stops", places: 64},
	{name: "llama", args: []string{"--tokens", "32", "--token-rate", "2000", "--max-running", "4", "--close-after-stream"}, hangup: "stream", places: 4},
	{name: "chunks", args: []string{"--tokens", "64"}, hangup: "stops", places: 64},
}

// pathSide is one proxy in front of its own engines.
type pathSide struct {
	name    string
	bases   map[string]string // the proxy's base URL per engine kind
	direct  map[string]string // the engine's own base URL per kind
	pid     int               // the proxy's process (the role's)
	procs   []int             // or one proxy process per engine kind
	engines map[string]int    // engine pids per kind
}

func measureEnginePath(b *testing.B) []string {
	r := harness.StartStandalone(b, harness.Options{})
	role := &pathSide{name: "role", bases: map[string]string{}, direct: map[string]string{}, engines: map[string]int{}, pid: r.PID()}
	bare := &pathSide{name: "bare proxy", bases: map[string]string{}, direct: map[string]string{}, engines: map[string]int{}}
	for _, e := range pathEngines {
		m := strings.Replace(harness.FakeManifest(e.args...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
		m += "non_streamed_hangup = \"" + e.hangup + "\"\n"
		f := r.WriteFile("manifests/"+e.name+".hcl", m)
		if out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", e.name, "--manifest", f, "--yes"); code != 0 {
			b.Fatalf("engine add %s: %d %s %s", e.name, code, out, errOut)
		}
		spec := fmt.Sprintf("deployment %q {\n  engine = %q\n  model {\n    path = %q\n  }\n  engine_config {\n    max_concurrent_requests = %d\n  }\n}\n", e.name, e.name, e.name, e.places)
		r.MustDeploy(e.name, spec)
		st, err := r.Mgmt.Deployment(context.Background(), e.name)
		if err != nil || len(st.Instances) == 0 {
			b.Fatalf("status %s: %v", e.name, err)
		}
		role.bases[e.name] = r.InferenceURL()
		role.direct[e.name] = "http://127.0.0.1:" + strconv.Itoa(st.Instances[0].Port)
		role.engines[e.name] = st.Instances[0].PID
		url, pid := spawnFake(b, r.FakeBin, e.name, e.args...)
		bare.direct[e.name] = url
		bare.engines[e.name] = pid
		pu, ppid := startBareProxyPID(b, url)
		bare.bases[e.name] = pu
		bare.procs = append(bare.procs, ppid)
	}
	key := r.Creds.APIKey
	sides := []*pathSide{role, bare}
	var out []string
	say := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	say("engine path, %d rounds interleaved, medians; ratio = role / bare proxy", pathRounds)

	// Warm every path.
	for _, s := range sides {
		for _, e := range pathEngines {
			runLoad(b, s.bases[e.name], key, e.name, false, 4, 40)
			runLoad(b, s.bases[e.name], key, e.name, true, 4, 40)
		}
	}

	// 1. Small non-streamed answer, c=1: latency added to the engine.
	var added [2][]float64
	for round := 0; round < pathRounds; round++ {
		for i, s := range sides {
			direct := runLoad(b, s.direct["fast"], key, "fast", false, 1, 300)
			via := runLoad(b, s.bases["fast"], key, "fast", false, 1, 300)
			added[i] = append(added[i], via.p(0.5)-direct.p(0.5))
		}
	}
	a0, a1 := median(added[0]), median(added[1])
	say("c=1 small answer, added p50: role %.3f ms, bare proxy %.3f ms, ratio %.2f (target <= 1.2)", a0, a1, ratio(a0, a1))

	// 2. Small non-streamed answer, c=32: requests/s and CPU per request.
	var rps, cpu, ecpu [2][]float64
	for round := 0; round < pathRounds; round++ {
		for i, s := range sides {
			pid := s.proxyPID("fast")
			c0, e0 := cpuTicks(pid), cpuTicks(s.engines["fast"])
			l := runLoad(b, s.bases["fast"], key, "fast", false, 32, 3000)
			c1, e1 := cpuTicks(pid), cpuTicks(s.engines["fast"])
			rps[i] = append(rps[i], l.rps())
			cpu[i] = append(cpu[i], ticksPer(c1-c0, l.n))
			ecpu[i] = append(ecpu[i], ticksPer(e1-e0, l.n))
			if l.failed() > 0 {
				say("  c=32 %s: %d failed (%v)", s.name, l.failed(), l.errs)
			}
		}
	}
	say("c=32 small answer: role %.0f req/s, bare proxy %.0f req/s, ratio %.2f", median(rps[0]), median(rps[1]), ratio(median(rps[0]), median(rps[1])))
	say("c=32 proxy CPU per request: role %.0f µs, bare proxy %.0f µs, ratio %.2f (target <= 1.0)", median(cpu[0]), median(cpu[1]), ratio(median(cpu[0]), median(cpu[1])))
	say("c=32 engine CPU per request: behind the role %.0f µs, behind the bare proxy %.0f µs, ratio %.2f", median(ecpu[0]), median(ecpu[1]), ratio(median(ecpu[0]), median(ecpu[1])))

	// 3. 64-chunk stream, c=1: last chunk.
	var last50, last99, first50 [2][]float64
	for round := 0; round < pathRounds; round++ {
		for i, s := range sides {
			l := runLoad(b, s.bases["chunks"], key, "chunks", true, 1, 300)
			last50[i] = append(last50[i], l.p(0.5))
			last99[i] = append(last99[i], l.p(0.99))
			first50[i] = append(first50[i], l.firstP(0.5))
		}
	}
	say("64-chunk stream c=1: first chunk p50 role %.3f / bare %.3f ms; last chunk p50 role %.3f / bare %.3f ms; last chunk p99 role %.3f / bare %.3f ms, ratio %.2f (target <= 1.2)",
		median(first50[0]), median(first50[1]), median(last50[0]), median(last50[1]), median(last99[0]), median(last99[1]), ratio(median(last99[0]), median(last99[1])))

	// 4. The llama-like engine at c=4: 400 streamed, then 400 non-streamed.
	for _, stream := range []bool{true, false} {
		kind := "non-streamed"
		if stream {
			kind = "streamed"
		}
		var errs [2][]float64
		var first, tps, pcpu, engcpu [2][]float64
		for round := 0; round < pathRounds; round++ {
			for i, s := range sides {
				pid := s.proxyPID("llama")
				c0, e0 := cpuTicks(pid), cpuTicks(s.engines["llama"])
				l := runLoad(b, s.bases["llama"], key, "llama", stream, 4, 400)
				c1, e1 := cpuTicks(pid), cpuTicks(s.engines["llama"])
				errs[i] = append(errs[i], float64(l.failed()))
				first[i] = append(first[i], l.firstP(0.5))
				tps[i] = append(tps[i], l.tokensPerSecond())
				pcpu[i] = append(pcpu[i], ticksPer(c1-c0, l.n))
				engcpu[i] = append(engcpu[i], ticksPer(e1-e0, l.n))
				if l.failed() > 0 {
					say("  llama %s c=4 %s round %d: %v", kind, s.name, round+1, l.errs)
				}
			}
		}
		say("llama-like c=4 %s, errors per 400: role %.0f, bare proxy %.0f (target 0)", kind, median(errs[0]), median(errs[1]))
		if stream {
			say("llama-like c=4 streamed first chunk p50: role %.2f ms, bare proxy %.2f ms, ratio %.2f", median(first[0]), median(first[1]), ratio(median(first[0]), median(first[1])))
		}
		say("llama-like c=4 %s tokens/s: role %.0f, bare proxy %.0f, ratio %.2f", kind, median(tps[0]), median(tps[1]), ratio(median(tps[0]), median(tps[1])))
		say("llama-like c=4 %s proxy CPU per request: role %.0f µs, bare proxy %.0f µs, ratio %.2f; engine CPU per request %.0f / %.0f µs",
			kind, median(pcpu[0]), median(pcpu[1]), ratio(median(pcpu[0]), median(pcpu[1])), median(engcpu[0]), median(engcpu[1]))
	}
	held, settledIn := placesHeld(b, r)
	say("places of the llama-like deployment still held after the runs: %d (target 0; all free %.0f ms after the last request)", held, settledIn)

	// 5. Cold start of an engine that needs 30 ms before it listens.
	own, cold := coldStart(b, r, key)
	say("cold start, engine listening after 30 ms: the engine alone %.1f ms, a cold request through the role %.1f ms, CapyCTL's own share %.1f ms (target < 20)", own, cold, cold-own)
	return out
}

const pathRounds = 3

// proxyPID is the process that proxies kind.
func (s *pathSide) proxyPID(kind string) int {
	if s.procs == nil {
		return s.pid
	}
	for i, e := range pathEngines {
		if e.name == kind {
			return s.procs[i]
		}
	}
	return s.pid
}

// loadResult is what one load run saw.
type loadResult struct {
	n       int
	lat     []time.Duration // to the end of the answer
	first   []time.Duration // to the first content (streams)
	tokens  int
	elapsed time.Duration
	errs    map[string]int
}

func (l *loadResult) p(q float64) float64      { return pct(l.lat, q) }
func (l *loadResult) firstP(q float64) float64 { return pct(l.first, q) }
func (l *loadResult) rps() float64             { return float64(l.n) / l.elapsed.Seconds() }
func (l *loadResult) tokensPerSecond() float64 { return float64(l.tokens) / l.elapsed.Seconds() }
func (l *loadResult) failed() int {
	n := 0
	for _, v := range l.errs {
		n += v
	}
	return n
}

// pathClient opens as many connections as the load needs and keeps them.
var pathClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024, DisableCompression: true}}

// runLoad sends n requests with conc clients and reads every answer whole.
func runLoad(b *testing.B, base, key, model string, stream bool, conc, n int) *loadResult {
	body := fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"hello"}]}`, model, stream)
	res := &loadResult{n: n, errs: map[string]int{}}
	var mu sync.Mutex
	var next int
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= n {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				lat, first, toks, errKey := oneRequest(base, key, body, stream)
				mu.Lock()
				if errKey != "" {
					res.errs[errKey]++
				} else {
					res.lat = append(res.lat, lat)
					if stream {
						res.first = append(res.first, first)
					}
					res.tokens += toks
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// oneRequest sends one chat request; errKey is "" for a complete answer.
func oneRequest(base, key, body string, stream bool) (lat, first time.Duration, tokens int, errKey string) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := pathClient.Do(req)
	if err != nil {
		return 0, 0, 0, "transport"
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, 0, 0, strconv.Itoa(resp.StatusCode)
	}
	if !stream {
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, 0, 0, "body"
		}
		i := strings.Index(string(data), `"completion_tokens":`)
		if i >= 0 {
			tokens, _ = strconv.Atoi(strings.TrimRight(strings.SplitN(string(data[i+20:]), ",", 2)[0], "}"))
		}
		return time.Since(start), 0, tokens, ""
	}
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			if first == 0 {
				first = time.Since(start)
			}
			tokens++
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			done = true
		}
		if err != nil {
			break
		}
	}
	if !done {
		return 0, 0, 0, "truncated"
	}
	return time.Since(start), first, tokens, ""
}

// spawnFake starts the fake engine by hand on a free loopback port and
// waits until it answers.
func spawnFake(b *testing.B, bin, served string, args ...string) (string, int) {
	port := freePort(b)
	argv := append([]string{"serve", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--served-name", served}, args...)
	cmd := exec.Command(bin, argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	waitAnswers(b, url, served, 30*time.Second, 500*time.Microsecond)
	return url, cmd.Process.Pid
}

// waitAnswers polls every interval until the engine answers a chat request.
func waitAnswers(b *testing.B, url, served string, limit, interval time.Duration) {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, served)
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		resp, err := pathClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(interval)
	}
	b.Fatalf("the engine at %s did not answer within %s", url, limit)
}

func freePort(b *testing.B) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startBareProxyPID is startBareProxy with the proxy's pid.
func startBareProxyPID(b testing.TB, target string) (string, int) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), bareProxyEnv+"="+target)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("the bare proxy did not start: %v", err)
	}
	return "http://" + strings.TrimSpace(line), cmd.Process.Pid
}

// cpuTicks is a process's user and system CPU time in clock ticks
// (1/100 s on Linux), 0 when it cannot be read.
func cpuTicks(pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// ticksPer is CPU microseconds per request from clock ticks.
func ticksPer(ticks int64, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(ticks) * 10_000 / float64(n)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// placesHeld reads how many places of the llama-like deployment cut
// requests still hold, and how long after now every place was free.
func placesHeld(b *testing.B, r *harness.Role) (int, float64) {
	start := time.Now()
	read := func() int {
		st, err := r.Mgmt.Deployment(context.Background(), "llama")
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, k := range []string{"in_flight", "settle_when_idle", "settle_at_stop", "settle_on_abort"} {
			if v, ok := st.Requests[k].(float64); ok {
				n += int(v)
			}
		}
		return n
	}
	held := read()
	for held > 0 && time.Since(start) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
		held = read()
	}
	return held, ms(time.Since(start))
}

// coldStart is the engine's own start (spawned by hand, polled every half
// millisecond) and a cold request through the role (an on-demand
// deployment whose engine needs 30 ms before it listens), p50 of five.
func coldStart(b *testing.B, r *harness.Role, key string) (own, cold float64) {
	args := []string{"--tokens", "4", "--startup-delay", "30ms"}
	m := strings.Replace(harness.FakeManifest(args...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
	f := r.WriteFile("manifests/cold.hcl", m)
	if out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", "cold", "--manifest", f, "--yes"); code != 0 {
		b.Fatalf("engine add cold: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := r.Deploy("cold", harness.SimpleSpec("cold", "cold")); code != 0 {
		b.Fatalf("deploy cold: %d %s %s", code, out, errOut)
	}
	var owns, colds []time.Duration
	for i := 0; i < 5; i++ {
		start := time.Now()
		url, pid := spawnFake(b, r.FakeBin, "cold", args...)
		owns = append(owns, time.Since(start))
		_ = url
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
		// A restart-only engine parks by stopping; the next request starts
		// it again.
		if out, errOut, code := r.CLI("park", "deployment", "cold", "--wait"); code != 0 && i > 0 {
			b.Fatalf("park cold: %d %s %s", code, out, errOut)
		}
		lat, _, _, errKey := oneRequest(r.InferenceURL(), key, `{"model":"cold","messages":[{"role":"user","content":"hi"}]}`, false)
		if errKey != "" {
			b.Fatalf("cold request: %s", errKey)
		}
		colds = append(colds, lat)
	}
	return pct(owns, 0.5), pct(colds, 0.5)
}
