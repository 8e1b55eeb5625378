// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk/engineapi"
)

// switchSetup is a real role on one simulated 24 GiB card with a fake vLLM
// and two deployments, a and b, that do not fit on the card together.
func switchSetup(b *testing.B) *harness.Role {
	b.Helper()
	r := harness.StartSimulated(b, harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}, harness.Options{})
	venv := conformance.FakeVenv(b, b.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := r.CLI("engine", "add", venv, "--yes", "--env", "CAPYCTL_FAKE_SIM_WEIGHTS=8GiB"); code != 0 {
		b.Fatalf("engine add: %d %s %s", code, out, errOut)
	}
	for _, name := range []string{"a", "b"} {
		conformance.FakeModel(b, filepath.Join(r.StateDir, "models", name), 1<<20)
		spec := fmt.Sprintf("deployment %q {\n  engine = \"vllm\"\n  model {\n    path = \"%s/model\"\n  }\n"+
			"  engine_config {\n    memory {\n      request = \"14GiB\"\n      startup = \"14GiB\"\n    }\n  }\n}\n", name, name)
		f := r.WriteFile("specs/"+name+".hcl", spec)
		if out, errOut, code := r.CLI("deploy", "--file", f); code != 0 {
			b.Fatalf("deploy %s: %d %s %s", name, code, out, errOut)
		}
	}
	return r
}

func timedChat(b *testing.B, r *harness.Role, model string) time.Duration {
	b.Helper()
	start := time.Now()
	resp, err := r.Chat(context.Background(), harness.ChatBody(model, false, "hello"), nil)
	if err != nil {
		b.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != 200 {
		b.Fatalf("%s: %d %s", model, resp.StatusCode, body)
	}
	return time.Since(start)
}

// engineClient reaches a deployment's engine: on its Unix socket when it
// has one, else on its loopback port.
func engineClient(b *testing.B, r *harness.Role, name string) *engineapi.EngineClient {
	st, err := r.Mgmt.Deployment(context.Background(), name)
	if err != nil || len(st.Instances) == 0 {
		b.Fatalf("status %s: %v", name, err)
	}
	in := st.Instances[0]
	if strings.HasPrefix(in.Endpoint, engineapi.UnixScheme) {
		return engineapi.NewEngineClient(in.Endpoint, "", "")
	}
	return engineapi.NewEngineClient("http://127.0.0.1:"+strconv.Itoa(in.Port), "", "")
}

// timedPost times a bare POST to an engine's control route.
func timedPost(b *testing.B, c *engineapi.EngineClient, path string) time.Duration {
	start := time.Now()
	req, err := c.NewRequest(context.Background(), http.MethodPost, path, strings.NewReader(""))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s: %d", path, resp.StatusCode)
	}
	return time.Since(start)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkRole_WakeAndSwitch measures, in one run through a real role on a
// fake vLLM: a request to a ready model (the baseline), a request that wakes
// its parked model (no switch), and a request that switches (parks the
// other model, then wakes its own); and the fake engine's own sleep and
// wake_up times, called directly. What CapyCTL adds to a wake is the wake
// request less the ready request less the engine's own wake.
func BenchmarkRole_WakeAndSwitch(b *testing.B) {
	r := switchSetup(b)
	// Warm both (first starts are measured, then every switch parks).
	timedChat(b, r, "a")
	timedChat(b, r, "b")
	timedChat(b, r, "a")
	n := max(b.N, 10)
	var ready, wake, sw, engineSleep, engineWake []time.Duration
	b.ResetTimer()
	for i := 0; i < n; i++ {
		ready = append(ready, timedChat(b, r, "a"))
		if out, errOut, code := r.CLI("park", "deployment", "a", "--wait"); code != 0 {
			b.Fatalf("park: %d %s %s", code, out, errOut)
		}
		wake = append(wake, timedChat(b, r, "a"))
		// a is ready and b parked: b's request switches.
		sw = append(sw, timedChat(b, r, "b"))
		timedChat(b, r, "a")
	}
	b.StopTimer()
	// The engine's own park and wake, called directly on a's engine once
	// both are parked (so its wake fits on the card); CapyCTL is not
	// involved.
	if out, errOut, code := r.CLI("park", "deployment", "a", "--wait"); code != 0 {
		b.Fatalf("park: %d %s %s", code, out, errOut)
	}
	ec := engineClient(b, r, "a")
	for i := 0; i < n; i++ {
		engineWake = append(engineWake, timedPost(b, ec, "/wake_up"))
		engineSleep = append(engineSleep, timedPost(b, ec, "/sleep?level=2"))
	}
	pr, pw, ps := pct(ready, .5), pct(wake, .5), pct(sw, .5)
	pes, pew := pct(engineSleep, .5), pct(engineWake, .5)
	b.ReportMetric(pr, "ready-p50-ms")
	b.ReportMetric(pw, "wake-p50-ms")
	b.ReportMetric(ps, "switch-p50-ms")
	b.ReportMetric(pw-pr-pew, "added-per-wake-ms")
	b.ReportMetric(ps-pr-pew-pes, "added-per-switch-ms")
	b.Logf("ready request p50 %.2f ms; wake request p50 %.2f ms (p99 %.2f); switch request p50 %.2f ms (p99 %.2f)",
		pr, pw, pct(wake, .99), ps, pct(sw, .99))
	b.Logf("engine's own: sleep p50 %.2f ms, wake_up p50 %.2f ms", pes, pew)
	b.Logf("CapyCTL adds per wake %.2f ms (target < 5 ms), per switch %.2f ms, beyond the engine's own park/wake and a ready request",
		pw-pr-pew, ps-pr-pew-pes)
	_ = ms
}
