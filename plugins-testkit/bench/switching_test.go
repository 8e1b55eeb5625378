// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// The switching trace: four models on one simulated 24 GiB card (22.08 GiB
// managed), any two of which fit and no three, on fake vLLM engines with
// realistic costs replayed at traceSpeed: a cold start of 20 s, a wake of
// 0.5 to 3 s by the model's size (4 to 7 GiB of weights: copied back from
// host RAM at 8 GiB/s after sleep level 1, read from disk at 2.33 GiB/s
// after level 2), answers of 100 tokens at 50 tokens/s. Requests arrive per
// model as Poisson processes whose rates overlap, for ten minutes of trace
// time; the same trace (same seed) is replayed against a role running
// today's policy (switching.policy = "immediate") and one running turns.
// Clients behave like the OpenAI SDKs with a patience: a 409, 429 or 5xx
// answer is retried after its Retry-After (or the SDKs' backoff: 0.5 s
// doubling up to 8 s, in trace time) until the request is answered or its
// bound (traceDeadline, the same bound the turns' requests wait within) is
// spent.
//
// IMPORTANT: both policies get the same patience. Before, a client gave up
// after two retries, so the policy before turns was not charged the
// switches its refused requests would have cost when retried (a refused
// request costs no switch), and its latency percentiles left the refused
// requests out. Now a request refused in the end counts as slower than any
// answer, and a switch is counted as a model moved off the card to make
// room (evicted: parked or stopped), the same for both policies, with the
// switches completed (the room made and the model in) beside it.

const (
	traceSpeed    = 10
	traceDuration = 10 * time.Minute
	traceSeed     = 26
	// traceDeadline is every deployment's request_deadline, the bound a
	// request may wait within.
	traceDeadline = 60 * time.Second
)

// traceModel is one model of the trace.
type traceModel struct {
	name    string
	weights string  // on the simulated card
	request string  // engine_config.memory.request (and startup)
	perMin  float64 // Poisson arrivals per minute of trace time
}

var traceModels = []traceModel{
	{"m1", "4GiB", "7GiB", 30},
	{"m2", "5GiB", "7.5GiB", 20},
	{"m3", "6GiB", "8GiB", 15},
	{"m4", "7GiB", "8.5GiB", 10},
}

// traceRequest is one request of the trace: its model and arrival, in
// trace time.
type traceRequest struct {
	model string
	at    time.Duration
}

// makeTrace draws the arrivals of every model, merged by time.
func makeTrace() []traceRequest { return makeTraceSeed(traceSeed) }

// makeTraceSeed draws the trace of another seed (the trace model's check
// that a policy is not fitted to one draw).
func makeTraceSeed(seed uint64) []traceRequest {
	rng := rand.New(rand.NewPCG(seed, seed))
	var out []traceRequest
	for _, m := range traceModels {
		mean := time.Duration(float64(time.Minute) / m.perMin)
		for at := time.Duration(0); ; {
			at += time.Duration(rng.ExpFloat64() * float64(mean))
			if at >= traceDuration {
				break
			}
			out = append(out, traceRequest{model: m.name, at: at})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// traceResult is one request's outcome.
type traceResult struct {
	status  int           // the last answer's status (0: no answer)
	code    string        // the refusal's code, when it was refused
	first   string        // the first answer's code, when it was refused
	latency time.Duration // arrival to the end of the last answer, wall time
	tries   int
}

// policyFigures are one policy's figures over the trace.
type policyFigures struct {
	policy       string
	answered     int
	refused      map[string]int // final refusals by code
	firstRefused map[string]int // first attempts refused, by code
	// p50, p95 and p99 are of every request, retries included, a request
	// refused in the end counted as slower than any answer; the answered
	// ones' alone beside them.
	p50, p95, p99    time.Duration
	ap50, ap95, ap99 time.Duration
	tries            int // attempts in all
	switches         float64
	swapShare        float64 // share of the replay's wall time spent switching
	wall             time.Duration
	// starts and wakes count the models' cold starts and wakes; evictions
	// the models a switch parked or stopped (a switch that was refused in
	// the end included).
	starts, wakes, evictions int
	// turnsEnded counts the turns ended for a switch, by why.
	turnsEnded map[string]int
	// modelP95 is each model's p95 (as p95).
	modelP95 map[string]time.Duration
	// tailFirstMinute counts the requests at or past p95 that arrived in
	// the trace's first minute (every model cold then).
	tailFirstMinute, tail int
}

// startTraceRole starts a role on the trace's card with the four models
// deployed (stopped: the trace starts cold).
func startTraceRole(b *testing.B, policy string) *harness.Role {
	b.Helper()
	// The turn time scales with the trace: 30 s of trace time.
	r := harness.StartSimulated(b, harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"},
		harness.Options{Env: []string{"CAPYCTL_SWITCHING_POLICY=" + policy, "CAPYCTL_SWITCHING_TURN_TIME=" + traceTurnTime().String()}})
	for _, m := range traceModels {
		venv := conformance.FakeVenv(b, b.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
		env := []string{
			"CAPYCTL_FAKE_SIM_WEIGHTS=" + m.weights,
			"CAPYCTL_FAKE_SIM_KV=1GiB",
			"CAPYCTL_FAKE_STARTUP_DELAY=" + (20 * time.Second / traceSpeed).String(),
			"CAPYCTL_FAKE_TOKENS=100",
			"CAPYCTL_FAKE_TOKEN_RATE=" + strconv.Itoa(50*traceSpeed),
			"CAPYCTL_FAKE_SIM_WAKE_RATE=" + strconv.Itoa(8*traceSpeed) + "GiB",
			"CAPYCTL_FAKE_SIM_RELOAD_RATE=" + strconv.Itoa(2386*traceSpeed) + "MiB", // 2.33 GiB/s
		}
		args := []string{"engine", "add", venv, "--name", "vllm-" + m.name, "--yes"}
		for _, e := range env {
			args = append(args, "--env", e)
		}
		if out, errOut, code := r.CLI(args...); code != 0 {
			b.Fatalf("engine add %s: exit %d\n%s%s", m.name, code, out, errOut)
		}
		// A sparse checkpoint of the model's real size: the driver sizes the
		// host copy of a sleep at level 1 from it.
		w, err := strconv.ParseInt(strings.TrimSuffix(m.weights, "GiB"), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		conformance.FakeModel(b, filepath.Join(r.StateDir, "models", m.name), w<<30)
		spec := fmt.Sprintf("deployment %q {\n  engine = %q\n  request_deadline = %q\n  model {\n    path = \"%s/model\"\n  }\n  engine_config {\n    memory {\n      request = %q\n      startup = %q\n    }\n  }\n}\n",
			m.name, "vllm-"+m.name, traceDeadline.String(), m.name, m.request, m.request)
		f := r.WriteFile("specs/"+m.name+".hcl", spec)
		if out, errOut, code := r.CLI("deploy", "--file", f); code != 0 {
			b.Fatalf("deploy %s: exit %d\n%s%s", m.name, code, out, errOut)
		}
	}
	// Each model starts once and stops before the trace, so that its
	// checkpoint's fingerprint and its startup peak are measured: the trace
	// then begins with every model stopped, as after a role restart.
	for _, m := range traceModels {
		for _, action := range [][]string{{"start", "instance", m.name + "/0", "--wait"}, {"stop", "instance", m.name + "/0", "--wait"}} {
			if out, errOut, code := r.CLI(action...); code != 0 {
				b.Fatalf("%v: exit %d\n%s%s", action, code, out, errOut)
			}
		}
	}
	return r
}

// traceTurnTime is the role's switching.turn_time: the default, 30 s, of
// trace time, or $CAPYCTL_TRACE_TURN_TIME (trace time) to see what
// another turn time trades (p95 against switches).
func traceTurnTime() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("CAPYCTL_TRACE_TURN_TIME")); err == nil && d > 0 {
		return d / traceSpeed
	}
	return 30 * time.Second / traceSpeed
}

// replay sends the trace to a role at traceSpeed and returns the figures.
func replay(b *testing.B, policy string, trace []traceRequest) policyFigures {
	b.Helper()
	r := startTraceRole(b, policy)
	s := &roleSetup{r: r, key: r.Creds.APIKey}
	before := s.scrape(b)
	ectx, stopEvents := context.WithCancel(context.Background())
	kinds := map[string]int{}
	eventsDone := make(chan struct{})
	es, err := r.Mgmt.Events(ectx, "")
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(eventsDone)
		for {
			ev, err := es.Next()
			if err != nil {
				return
			}
			kinds[ev.Kind]++
			if ev.Kind == "switch_released" {
				kinds["released: "+fmt.Sprint(ev.Payload["released"])]++
			}
			if ev.Kind == "turn_ended" {
				kinds["turn ended: "+fmt.Sprint(ev.Payload["why"])]++
			}
			if ev.Kind == "switch_planned" {
				kinds["victim was "+fmt.Sprint(ev.Payload["victim_state"])]++
			}
		}
	}()
	results := make([]traceResult, len(trace))
	var wg sync.WaitGroup
	start := time.Now()
	for i, tr := range trace {
		if d := time.Until(start.Add(tr.at / traceSpeed)); d > 0 {
			time.Sleep(d) // the trace's clock: arrivals at their time
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = sdkRequest(r.InferenceURL(), s.key, tr.model, traceDeadline/traceSpeed)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	after := s.scrape(b)
	stopEvents()
	_ = es.Close()
	<-eventsDone
	f := policyFigures{policy: policy, refused: map[string]int{}, firstRefused: map[string]int{}, wall: wall,
		starts: kinds["instance_starting"], wakes: kinds["instance_waking"], evictions: kinds["switch_released"],
		turnsEnded: map[string]int{}, modelP95: map[string]time.Duration{}}
	for k, n := range kinds {
		if why, ok := strings.CutPrefix(k, "turn ended: "); ok {
			f.turnsEnded[why] = n
		}
	}
	byModel := map[string][]time.Duration{}
	var lat, all []time.Duration
	for i, res := range results {
		byModel[trace[i].model] = append(byModel[trace[i].model], res.latency)
		if res.status != http.StatusOK {
			byModel[trace[i].model][len(byModel[trace[i].model])-1] = time.Duration(math.MaxInt64)
		}
		f.tries += res.tries
		if res.first != "" {
			f.firstRefused[res.first]++
		}
		if res.status == http.StatusOK {
			f.answered++
			lat = append(lat, res.latency)
			all = append(all, res.latency)
			continue
		}
		all = append(all, time.Duration(math.MaxInt64)) // refused: slower than any answer
		code := res.code
		if code == "" {
			code = "status_" + strconv.Itoa(res.status)
		}
		f.refused[code]++
	}
	for m, ds := range byModel {
		f.modelP95[m] = percentile(ds, .95)
	}
	f.p50, f.p95, f.p99 = percentile(all, .50), percentile(all, .95), percentile(all, .99)
	for i, res := range results {
		if res.status != http.StatusOK || res.latency >= f.p95 {
			f.tail++
			if trace[i].at < time.Minute {
				f.tailFirstMinute++
			}
		}
	}
	dumpTrace(b, policy, trace, results)
	f.ap50, f.ap95, f.ap99 = percentile(lat, .50), percentile(lat, .95), percentile(lat, .99)
	f.switches = after["capyctl_switches_total"] - before["capyctl_switches_total"]
	f.swapShare = (after["capyctl_switch_swap_seconds_total"] - before["capyctl_switch_swap_seconds_total"]) / wall.Seconds()
	return f
}

// dumpTrace writes every request's outcome to
// $CAPYCTL_TRACE_DUMP/<policy>.tsv when that is set (for a look at where
// the slow requests are): model, arrival in trace seconds, latency in wall
// milliseconds, status, tries, first refusal's code.
func dumpTrace(b *testing.B, policy string, trace []traceRequest, results []traceResult) {
	dir := os.Getenv("CAPYCTL_TRACE_DUMP")
	if dir == "" {
		return
	}
	var sb strings.Builder
	for i, res := range results {
		fmt.Fprintf(&sb, "%s\t%.3f\t%d\t%d\t%d\t%s\n", trace[i].model, trace[i].at.Seconds(), res.latency.Milliseconds(), res.status, res.tries, res.first)
	}
	if err := os.WriteFile(filepath.Join(dir, policy+".tsv"), []byte(sb.String()), 0o644); err != nil {
		b.Logf("trace dump: %v", err)
	}
}

// percentile is the p-quantile of ds (0 when empty); ds is sorted.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// sdkRequest sends one chat request as the OpenAI SDKs do, retrying a 409,
// 429 or 5xx answer after its Retry-After (at most 60 s) or the SDKs'
// backoff (0.5 s doubling up to 8 s, scaled to the trace's clock), until it
// is answered or the next try would start past patience from its arrival.
func sdkRequest(base, key, model string, patience time.Duration) traceResult {
	start := time.Now()
	giveUp := start.Add(patience)
	var res traceResult
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"Tell me a story."}]}`
	for try := 0; ; try++ {
		res.tries = try + 1
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			res.status, res.code = 0, "transport"
			break
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res.status, res.code = resp.StatusCode, ""
		if resp.StatusCode == http.StatusOK {
			break
		}
		if i := strings.Index(string(data), `"code":"`); i >= 0 {
			rest := string(data[i+8:])
			res.code = rest[:strings.IndexByte(rest, '"')]
		}
		if try == 0 {
			res.first = res.code
		}
		if resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
			break
		}
		wait := min(time.Duration(500*math.Pow(2, float64(try)))*time.Millisecond, 8*time.Second) / traceSpeed
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra >= 0 && ra <= 60 {
			// The server's figures are measured on the replay's clock
			// already.
			wait = time.Duration(ra) * time.Second
		}
		if time.Now().Add(wait).After(giveUp) {
			break
		}
		time.Sleep(wait)
	}
	res.latency = time.Since(start)
	return res
}

var (
	traceOnce    sync.Once
	traceFigures [2]policyFigures
)

// BenchmarkSwitching_Trace replays the switching trace (see the top of
// this file) against today's policy and turns, the same trace on each, and
// reports per policy: requests answered, refused by code, latency
// percentiles, switches and the share of wall time spent switching; and
// the ratios of today's figures to turns' (above 1: turns do better). The
// two replays run once; later rounds report the same figures.
func BenchmarkSwitching_Trace(b *testing.B) {
	traceOnce.Do(func() {
		trace := makeTrace()
		b.Logf("trace: %d requests over %s of trace time, replayed at %dx, turn time %s of trace time", len(trace), traceDuration, traceSpeed, traceTurnTime()*traceSpeed)
		traceFigures[0] = replay(b, "immediate", trace)
		traceFigures[1] = replay(b, "turns", trace)
	})
	for i := 0; i < b.N; i++ {
	}
	ms := func(d time.Duration) string {
		if d == time.Duration(math.MaxInt64) {
			return "refused"
		}
		return d.Round(time.Millisecond).String()
	}
	for _, f := range traceFigures {
		b.Logf("%-9s answered %d, refused %v (first tries refused %v; %d tries), p50 %s p95 %s p99 %s (answered alone: %s %s %s), %d models evicted (%v switches completed; %d cold starts, %d wakes), %.1f%% of %s switching",
			f.policy, f.answered, f.refused, f.firstRefused, f.tries, ms(f.p50), ms(f.p95), ms(f.p99),
			ms(f.ap50), ms(f.ap95), ms(f.ap99), f.evictions, f.switches, f.starts, f.wakes, 100*f.swapShare, f.wall.Round(time.Second))
		var per []string
		for _, m := range traceModels {
			per = append(per, m.name+" "+ms(f.modelP95[m.name]))
		}
		b.Logf("%-9s p95 by model: %s; turns ended for a switch, by why: %v; %d of the %d requests at or past p95 arrived in the first minute",
			f.policy, strings.Join(per, ", "), f.turnsEnded, f.tailFirstMinute, f.tail)
		p := f.policy + "-"
		b.ReportMetric(float64(f.answered), p+"answered")
		refused := 0
		for _, n := range f.refused {
			refused += n
		}
		b.ReportMetric(float64(refused), p+"refused")
		for _, q := range []struct {
			name string
			d    time.Duration
		}{{"p50-ms", f.p50}, {"p95-ms", f.p95}, {"p99-ms", f.p99}} {
			if q.d != time.Duration(math.MaxInt64) {
				b.ReportMetric(float64(q.d.Milliseconds()), p+q.name)
			}
		}
		b.ReportMetric(float64(f.evictions), p+"switches")
		b.ReportMetric(f.switches, p+"switches-completed")
		if f.answered > 0 {
			b.ReportMetric(float64(f.evictions)/float64(f.answered), p+"switches/answered")
		}
		b.ReportMetric(100*f.swapShare, p+"switching-%")
	}
	old, turns := traceFigures[0], traceFigures[1]
	if turns.p95 > 0 && old.p95 != time.Duration(math.MaxInt64) {
		b.ReportMetric(float64(old.p95)/float64(turns.p95), "p95-today/turns")
	}
	if turns.evictions > 0 {
		b.ReportMetric(float64(old.evictions)/float64(turns.evictions), "switches-today/turns")
	}
	if turns.switches > 0 {
		b.ReportMetric(old.switches/turns.switches, "switches-completed-today/turns")
	}
	if turns.swapShare > 0 {
		b.ReportMetric(old.swapShare/turns.swapShare, "switching-time-today/turns")
	}
}
