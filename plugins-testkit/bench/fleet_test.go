// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// fleetSetup is a server and one host, each a process of its own on
// loopback, serving "demo" on the fake engine (no engine key), beside a
// standalone role serving the same: the hop a server adds is measured
// against the standalone role in the same run.
type fleetSetup struct {
	alone  *roleSetup // the standalone baseline
	server *harness.Role
	host   *roleSetup // the host: its engine's URL and its stats
}

func startFleetBench(b testing.TB, spec string, fakeArgs ...string) *fleetSetup {
	b.Helper()
	alone := startRole(b, spec, fakeArgs...)
	server, host := startFleet(b, "", spec, fakeArgs...)
	return &fleetSetup{alone: alone, server: server, host: host}
}

// baselineBin is the capyctl of another build to measure beside this one
// (CAPYCTL_BENCH_BASELINE names its directory; "": none).
func baselineBin() string {
	if dir := os.Getenv("CAPYCTL_BENCH_BASELINE"); dir != "" {
		return filepath.Join(dir, "capyctl")
	}
	return ""
}

// startFleet starts a server and a host of the capyctl at bin ("": this
// build's) serving spec on the fake engine.
func startFleet(b testing.TB, bin, spec string, fakeArgs ...string) (*harness.Role, *roleSetup) {
	b.Helper()
	server := harness.StartServer(b, harness.Options{Bin: bin})
	host := harness.StartHost(b, server, harness.HostOptions{Options: harness.Options{Bin: bin}, Name: "gpu-a", GPU: harness.SimGPU{DeviceMemory: "80GiB"}})
	poll.Until(b, 30*time.Second, "the host ready", func() bool {
		out, _, _ := server.CLI("list", "hosts")
		return strings.Contains(out, "ready")
	})
	m := strings.Replace(harness.FakeManifest(fakeArgs...), "key_env     = \"FAKE_ENGINE_API_KEY\"\n", "", 1)
	f := server.WriteFile("manifests/fake.hcl", m)
	if out, errOut, code := server.CLI("engine", "add", "--custom", server.FakeBin, "--name", "fake", "--manifest", f, "--yes"); code != 0 {
		b.Fatalf("engine add: %d %s %s", code, out, errOut)
	}
	host.WriteFile("models/demo/README", "fake model\n")
	poll.Until(b, 10*time.Second, "the server lists the engine", func() bool {
		out, _, _ := server.CLI("list", "hosts")
		return strings.Contains(out, "fake")
	})
	server.MustDeploy("demo", spec)
	st, err := host.Mgmt.Deployment(context.Background(), "demo")
	if err != nil || len(st.Instances) == 0 || st.Instances[0].Port == 0 {
		b.Fatalf("host status: %v %+v", err, st)
	}
	return server, &roleSetup{r: host, engine: "http://127.0.0.1:" + strconv.Itoa(st.Instances[0].Port), key: server.Creds.APIKey}
}

var (
	fleetC1Once sync.Once
	fleetC1     [3][]time.Duration // the engine directly, a standalone role, the server then the host
)

// BenchmarkFleet_HopSmallAnswer_C1 is what the server's hop adds: a small
// non-streamed answer at concurrency 1 through a standalone role and
// through a server that relays it to a host over the host's connection
// (TLS 1.3, HTTP/2), requests interleaved. Target: the hop adds at most
// 0.5 ms at p50 on loopback.
func BenchmarkFleet_HopSmallAnswer_C1(b *testing.B) {
	fleetC1Once.Do(func() {
		s := startFleetBench(b, harness.SimpleSpec("demo", "fake"), "--tokens", "4")
		alone := func(body string) time.Duration { return s.alone.post(b, s.alone.r.InferenceURL(), body) }
		viaServer := func(body string) time.Duration {
			return (&roleSetup{key: s.server.Creds.APIKey}).post(b, s.server.InferenceURL(), body)
		}
		direct := func(body string) time.Duration { return s.host.post(b, s.host.engine, body) }
		for i := 0; i < 100; i++ {
			direct(smallBodyFor("demo"))
			alone(smallBodyFor("demo"))
			viaServer(smallBodyFor("demo"))
		}
		for i := 0; i < 2000; i++ {
			fleetC1[0] = append(fleetC1[0], direct(smallBodyFor("demo")))
			fleetC1[1] = append(fleetC1[1], alone(smallBodyFor("demo")))
			fleetC1[2] = append(fleetC1[2], viaServer(smallBodyFor("demo")))
		}
	})
	for i := 0; i < b.N; i++ {
	}
	d50, a50, s50 := pct(fleetC1[0], .5), pct(fleetC1[1], .5), pct(fleetC1[2], .5)
	b.ReportMetric(d50, "engine-p50-ms")
	b.ReportMetric(a50, "standalone-p50-ms")
	b.ReportMetric(s50, "server-host-p50-ms")
	b.ReportMetric(s50-a50, "hop-added-p50-ms")
	b.ReportMetric(pct(fleetC1[2], .99)-pct(fleetC1[1], .99), "hop-added-p99-ms")
}

var (
	fleetHangOnce sync.Once
	fleetHang     [2][]time.Duration
)

// BenchmarkFleet_HangUpToEngineCancel is the time from a client's hang-up
// at the server to the fake engine's observed cancellation on the host,
// against the same through a standalone role. Target: 2 ms.
func BenchmarkFleet_HangUpToEngineCancel(b *testing.B) {
	fleetHangOnce.Do(func() {
		s := startFleetBench(b, harness.SimpleSpec("demo", "fake"), "--token-rate", "50", "--tokens", "100000")
		body := strings.Replace(streamBody, `"model":"m"`, `"model":"demo"`, 1)
		for i := 0; i < 100; i++ {
			fleetHang[0] = append(fleetHang[0], s.alone.hangUp(b, s.alone.r.InferenceURL(), body, s.alone.key))
			fleetHang[1] = append(fleetHang[1], s.host.hangUp(b, s.server.InferenceURL(), body, s.server.Creds.APIKey))
		}
	})
	for i := 0; i < b.N; i++ {
	}
	b.ReportMetric(pct(fleetHang[0], .5), "standalone-p50-ms")
	b.ReportMetric(pct(fleetHang[1], .5), "server-host-p50-ms")
	b.ReportMetric(pct(fleetHang[1], .99), "server-host-p99-ms")
}

var (
	fleetMemOnce sync.Once
	fleetMem     map[string]float64
)

// BenchmarkFleet_MemoryPerOpenStream opens 500 streams through the server
// (the engine trickles two tokens a second into each) and reports the
// resident memory each stream adds to the server and to the host (VmRSS
// before and after, divided by the streams). Target: 20 KiB each.
func BenchmarkFleet_MemoryPerOpenStream(b *testing.B) {
	const streams = 500
	fleetMemOnce.Do(func() {
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
		s := startFleetBench(b, spec, "--token-rate", "2", "--tokens", "100000", "--max-running", "1100")
		body := strings.Replace(streamBody, `"model":"m"`, `"model":"demo"`, 1)
		for i := 0; i < 20; i++ {
			openStream(b, s.server.Info.Inference, s.server.Creds.APIKey, body).Close()
		}
		time.Sleep(300 * time.Millisecond)
		srvSetup := &roleSetup{r: s.server}
		srvM0, hostM0 := srvSetup.scrape(b), s.host.scrape(b)
		srv0, host0 := vmRSS(b, s.server.PID()), vmRSS(b, s.host.r.PID())
		conns := openStreams(streams, 32, func() net.Conn { return openStream(b, s.server.Info.Inference, s.server.Creds.APIKey, body) })
		time.Sleep(300 * time.Millisecond)
		srv1, host1 := vmRSS(b, s.server.PID()), vmRSS(b, s.host.r.PID())
		srvM1, hostM1 := srvSetup.scrape(b), s.host.scrape(b)
		for _, c := range conns {
			c.Close()
		}
		live := func(before, after map[string]float64) float64 {
			k := func(name string) float64 { return after[name] - before[name] }
			return (k("go_memstats_heap_inuse_bytes") + k("go_memstats_stack_inuse_bytes")) / streams / 1024
		}
		fleetMem = map[string]float64{
			"server-rss-KiB/stream": float64(srv1-srv0) / streams, "host-rss-KiB/stream": float64(host1-host0) / streams,
			"server-heap+stack-KiB/stream": live(srvM0, srvM1), "host-heap+stack-KiB/stream": live(hostM0, hostM1),
			"server-goroutines/stream": (srvM1["go_goroutines"] - srvM0["go_goroutines"]) / streams,
			"server-stack-KiB/stream":  (srvM1["go_memstats_stack_inuse_bytes"] - srvM0["go_memstats_stack_inuse_bytes"]) / streams / 1024,
		}
	})
	for i := 0; i < b.N; i++ {
	}
	for k, v := range fleetMem {
		b.ReportMetric(v, k)
	}
}

// vmRSS is a process's resident memory in KiB.
func vmRSS(b testing.TB, pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	b.Fatalf("no VmRSS for %d", pid)
	return 0
}
