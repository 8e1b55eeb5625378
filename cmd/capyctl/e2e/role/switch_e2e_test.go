// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

func deploymentStatus(t *testing.T, r *harness.Role, name string) wire.DeploymentStatus {
	t.Helper()
	out, errOut, code := r.CLI("status", "deployment", name, "--json")
	if code != 0 {
		t.Fatalf("status %s: exit %d: %s", name, code, errOut)
	}
	var st wire.DeploymentStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st
}

// chat sends a non-streamed request and returns its status and body.
func chat(t *testing.T, r *harness.Role, model string) (int, string) {
	t.Helper()
	resp, err := r.Chat(context.Background(), harness.ChatBody(model, false, "hello"), nil)
	if err != nil {
		t.Fatalf("chat %s: %v", model, err)
	}
	return resp.StatusCode, harness.ReadAll(resp)
}

// cardUse returns what each process holds on the simulated card, and the
// total.
func cardUse(t *testing.T, r *harness.Role) (map[int]int64, int64) {
	t.Helper()
	st := r.SimState()
	per := map[int]int64{}
	var total int64
	for _, a := range st.Allocations {
		per[a.PID] += a.Bytes
		total += a.Bytes
	}
	return per, total
}

// ledgerWithinLimits fails the test if a domain of the host ledger is
// charged over its managed limit.
func ledgerWithinLimits(t *testing.T, r *harness.Role) {
	t.Helper()
	var hosts struct {
		Hosts []struct {
			Name   string         `json:"name"`
			Ledger map[string]any `json:"ledger"`
		} `json:"hosts"`
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+r.Info.Management+"/management/v1/hosts", nil)
	req.Header.Set("Authorization", "Bearer "+r.Creds.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if err := json.Unmarshal([]byte(body), &hosts); err != nil || len(hosts.Hosts) == 0 {
		t.Fatalf("hosts: %v %s", err, body)
	}
	doms, _ := hosts.Hosts[0].Ledger["domains"].([]any)
	if len(doms) == 0 {
		t.Fatalf("no ledger domains in %s", body)
	}
	for _, d := range doms {
		m := d.(map[string]any)
		charged, limit := num(m["charged_bytes"]), num(m["room_bytes"])
		if limit == 0 || charged > limit {
			t.Fatalf("domain %v charged %v over its limit %v", m["name"], charged, limit)
		}
	}
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func TestSwitch_AlternatingRequestsParkTheOther(t *testing.T) {
	r := e2e.SwitchRole(t, map[string][]string{"vllm": nil}, map[string][2]string{"a": {"vllm", ""}, "b": {"vllm", ""}})
	pids := map[string]int{}
	other := map[string]string{"a": "b", "b": "a"}
	for round := 0; round < 3; round++ {
		for _, name := range []string{"a", "b"} {
			if code, body := chat(t, r, name); code != http.StatusOK {
				t.Fatalf("round %d: request for %s: %d %s\nrole:\n%s", round, name, code, body, r.Output())
			}
			st := deploymentStatus(t, r, name)
			in := st.Instances[0]
			if in.State != "ready" {
				t.Fatalf("round %d: %s is %s", round, name, in.State)
			}
			if pids[name] == 0 {
				pids[name] = in.PID
			} else if in.PID != pids[name] {
				t.Fatalf("round %d: %s restarted (pid %d, was %d): a switch must wake it", round, name, in.PID, pids[name])
			}
			ledgerWithinLimits(t, r)
			if round == 0 && name == "a" {
				// The Qwen3-shaped model gets its family's parsers.
				out, _, _ := r.CLI("status", "deployment", "a")
				if !strings.Contains(out, "Parsers: tool calls hermes, reasoning qwen3 (model_family)") {
					t.Fatalf("status has no Parsers line:\n%s", out)
				}
				// vLLM 0.32 serves on a socket in its launch directory, and
				// every request, park and wake of this test goes there.
				if !strings.Contains(out, "a/0 exposure: unix socket in the launch directory (only the role's user)") {
					t.Fatalf("status has no socket exposure line:\n%s", out)
				}
				continue
			}
			o := deploymentStatus(t, r, other[name]).Instances[0]
			if o.State != "parked" || o.Released != "parked (switch)" {
				t.Fatalf("round %d: %s is %s (%q), want parked by the switch", round, other[name], o.State, o.Released)
			}
			per, total := cardUse(t, r)
			if held := per[o.PID]; held == 0 || held > 1<<30 {
				t.Fatalf("round %d: the parked engine of %s holds %d bytes on the card", round, other[name], held)
			}
			if held := per[in.PID]; held < 8<<30 {
				t.Fatalf("round %d: the ready engine of %s holds only %d bytes", round, name, held)
			}
			if total > 24<<30 {
				t.Fatalf("round %d: the card holds %d bytes, over its 24 GiB", round, total)
			}
		}
	}
}

func TestSwitch_StartEvictAndIdleTimers(t *testing.T) {
	idle := "  lifecycle {\n    ready_idle_timeout  = \"1s\"\n    parked_idle_timeout = \"1s\"\n  }\n"
	r := e2e.SwitchRole(t, map[string][]string{"vllm": nil}, map[string][2]string{"a": {"vllm", ""}, "b": {"vllm", idle}})
	if out, errOut, code := r.CLI("start", "deployment", "a", "--wait"); code != 0 {
		t.Fatalf("start a: exit %d %s%s", code, out, errOut)
	}
	_, errOut, code := r.CLI("start", "deployment", "b", "--wait")
	if code != 4 || !strings.Contains(errOut, "capacity_blocked") || !strings.Contains(errOut, "could be evicted: a/0") {
		t.Fatalf("start b without --evict: exit %d: %s", code, errOut)
	}
	if out, errOut, code := r.CLI("start", "deployment", "b", "--wait", "--evict"); code != 0 {
		t.Fatalf("start b --evict: exit %d %s%s", code, out, errOut)
	}
	if st := deploymentStatus(t, r, "a").Instances[0]; st.State != "parked" {
		t.Fatalf("a is %s after start --evict of b", st.State)
	}
	// b's idle timers: ready → parked after 1s idle, parked → stopped after 1s.
	harness.Eventually(t, 30*time.Second, "b to park on its ready idle timer", func() bool {
		st := deploymentStatus(t, r, "b").Instances[0]
		return st.State == "parked" || st.State == "stopped"
	})
	harness.Eventually(t, 30*time.Second, "b to stop on its parked idle timer", func() bool {
		return deploymentStatus(t, r, "b").Instances[0].State == "stopped"
	})
	if rel := deploymentStatus(t, r, "b").Instances[0].Released; rel != "stopped (parked idle)" {
		t.Fatalf("b released %q", rel)
	}
	// a has no timers: it stays parked.
	if st := deploymentStatus(t, r, "a").Instances[0]; st.State != "parked" {
		t.Fatalf("a is %s", st.State)
	}
}

func TestSwitch_WakeCheckMismatchStops(t *testing.T) {
	r := e2e.SwitchRole(t, map[string][]string{"drifty": {"--env", "CAPYCTL_FAKE_WAKE_DRIFT=true"}}, map[string][2]string{"a": {"drifty", ""}})
	if code, body := chat(t, r, "a"); code != 200 {
		t.Fatalf("first request: %d %s", code, body)
	}
	first := deploymentStatus(t, r, "a").Instances[0].PID
	if out, errOut, code := r.CLI("park", "deployment", "a", "--wait"); code != 0 {
		t.Fatalf("park: exit %d %s%s", code, out, errOut)
	}
	code, body := chat(t, r, "a")
	if code == 200 || !strings.Contains(body, "wake_mismatch") {
		t.Fatalf("request that wakes a drifted model: %d %s", code, body)
	}
	in := deploymentStatus(t, r, "a").Instances[0]
	if in.State != "stopped" || in.LastError == nil || in.LastError.Code != "wake_mismatch" || harness.Alive(first) {
		t.Fatalf("after the mismatched wake: %+v (engine %d alive: %v)", in, first, harness.Alive(first))
	}
	// The next request starts it again.
	if code, body := chat(t, r, "a"); code != 200 {
		t.Fatalf("request after the stop: %d %s", code, body)
	}
}

func TestSwitch_KillCoreDuringSwitch(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "release-b")
	r := e2e.SwitchRole(t,
		map[string][]string{"vllm-a": nil, "vllm-b": {"--env", "CAPYCTL_FAKE_HOLD_STARTUP_FILE=" + hold}},
		map[string][2]string{"a": {"vllm-a", ""}, "b": {"vllm-b", ""}})
	if code, body := chat(t, r, "a"); code != 200 {
		t.Fatalf("a: %d %s", code, body)
	}
	aPID := deploymentStatus(t, r, "a").Instances[0].PID
	// A request for b switches: a parks, b starts and is held loading.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if resp, err := r.Chat(ctx, harness.ChatBody("b", false, "hi"), nil); err == nil {
			resp.Body.Close()
		}
	}()
	// "starting" is published before the driver spawns the engine: wait
	// for b's engine process too (a PID is shown once Start returned), or
	// the kill may land before anything of b runs, and the restarted core
	// rightly finds b gone.
	harness.Eventually(t, 30*time.Second, "the switch to be under way", func() bool {
		b := deploymentStatus(t, r, "b").Instances[0]
		return deploymentStatus(t, r, "a").Instances[0].State == "parked" &&
			b.State == "starting" && b.PID != 0
	})
	r.Kill9()
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.Restart()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("role output:\n%s", r.Output())
		}
	})
	harness.Eventually(t, 60*time.Second, "the restarted core to settle b ready and a parked", func() bool {
		return deploymentStatus(t, r, "b").Instances[0].State == "ready" &&
			deploymentStatus(t, r, "a").Instances[0].State == "parked"
	})
	ledgerWithinLimits(t, r)
	if p := deploymentStatus(t, r, "a").Instances[0].PID; p != aPID {
		t.Fatalf("a's engine changed across the restart: %d, was %d", p, aPID)
	}
	// Switching goes on from the settled state.
	if code, body := chat(t, r, "a"); code != 200 {
		t.Fatalf("a after the restart: %d %s", code, body)
	}
	if st := deploymentStatus(t, r, "b").Instances[0]; st.State != "parked" {
		t.Fatalf("b is %s after the switch back", st.State)
	}
	ledgerWithinLimits(t, r)
}

func TestSwitch_HostBackedRefusedOnUnifiedMemory(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{Unified: true, DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}, harness.Options{})
	venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := r.CLI("engine", "add", venv, "--yes"); code != 0 {
		t.Fatalf("engine add: %d %s%s", code, out, errOut)
	}
	conformance.FakeModel(t, filepath.Join(r.StateDir, "models", "hb"), 1<<20)
	spec := "deployment \"hb\" {\n  engine    = \"vllm\"\n  residency = \"host_backed\"\n  model {\n    path = \"hb/model\"\n  }\n}\n"
	f := r.WriteFile("specs/hb.hcl", spec)
	_, errOut, code := r.CLI("deploy", "--file", f)
	if code != 5 || !strings.Contains(errOut, "host_backed_unavailable") {
		t.Fatalf("host_backed on unified memory: exit %d: %s", code, errOut)
	}
}
