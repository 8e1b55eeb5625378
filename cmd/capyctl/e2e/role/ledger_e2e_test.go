// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

const gib = int64(1) << 30

// gpuSpec is a deployment on a custom engine that declares its memory.
func gpuSpec(name, engine, resources string) string {
	return fmt.Sprintf(`deployment %q {
  engine = %q
  model {
    path = %q
  }
  resources {
%s
  }
}
`, name, engine, name, resources)
}

// TestLedger_TwoFitTheThirdIsBlocked: on one simulated 25 GiB card (2 GiB
// reserve, 23 GiB managed), two deployments of 10 GiB both run, and a third
// of 8 GiB is refused capacity_blocked (exit 4) naming the host, the
// domain, the need, what is free and the limit. The fake engines really
// hold 8 GiB each on the card; that memory is CapyCTL's and is not counted
// a second time as memory held outside it.
func TestLedger_TwoFitTheThirdIsBlocked(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{DeviceMemory: "25GiB"}, harness.Options{})
	r.AddFakeEngine("fake", "--sim-weights", "8GiB")
	res := "    gpu = \"10GiB\"\n    ram = \"256MiB\""
	r.MustDeploy("a", gpuSpec("a", "fake", res))
	r.MustDeploy("b", gpuSpec("b", "fake", res))
	for _, n := range []string{"a", "b"} {
		if st := e2e.Status(t, r, n); st.State != "ready" {
			t.Fatalf("%s is %s", n, st.State)
		}
	}
	if out, errOut, code := r.Deploy("c", gpuSpec("c", "fake", "    gpu = \"8GiB\"\n    ram = \"256MiB\"")); code != 0 {
		t.Fatalf("deploy c: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code := r.CLI("start", "deployment", "c", "--wait")
	if code != 4 {
		t.Fatalf("start c: exit %d, want 4 (capacity)\n%s\nrole:\n%s", code, errOut, r.Output())
	}
	host := r.Info.Host
	for _, want := range []string{"capacity_blocked", "host " + host, "gpu0: needs 8GiB, 3GiB free of a 23GiB managed limit (20GiB charged), 5GiB short"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("refusal lacks %q:\n%s", want, errOut)
		}
	}
	// The API carries the figures as details.
	_, err := r.Mgmt.Action(context.Background(), "c", wire.ActionRequest{Action: "start", Wait: true})
	e := structs.AsError(err)
	if e == nil || e.Code != structs.CodeCapacityBlocked {
		t.Fatalf("api start: %v", err)
	}
	for k, want := range map[string]any{"host": host, "domain": "gpu0", "need_bytes": float64(8 * gib), "free_bytes": float64(3 * gib), "limit_bytes": float64(23 * gib)} {
		if got := e.Details[k]; got != want {
			t.Errorf("details[%s] = %v, want %v", k, got, want)
		}
	}
	// a and b still serve; the ledger shows them and nothing of c.
	e2e.ChatOK(t, r, "a")
	e2e.ChatOK(t, r, "b")
	st := e2e.Status(t, r, "c")
	if st.Instances[0].LastError == nil || st.Instances[0].LastError.Code != structs.CodeCapacityBlocked {
		t.Fatalf("c's last error: %+v", st.Instances[0].LastError)
	}
	mv := e2e.MemoryOf(t, e2e.Status(t, r, "a"))
	var card *int64
	for _, d := range mv.Ledger {
		if d.Name == "gpu0" {
			card = &d.Charged
			if d.External != 0 {
				t.Errorf("CapyCTL's own engines read as memory held outside it: %d", d.External)
			}
		}
	}
	if card == nil || *card != 20*gib {
		t.Fatalf("gpu0 charged %v, want 20GiB; ledger %+v", card, mv.Ledger)
	}
	// Stopping b makes room for c.
	if _, errOut, code := r.CLI("stop", "deployment", "b", "--wait"); code != 0 {
		t.Fatalf("stop b: %d %s", code, errOut)
	}
	if _, errOut, code := r.CLI("start", "deployment", "c", "--wait"); code != 0 {
		t.Fatalf("start c after b stopped: exit %d %s", code, errOut)
	}
	// The readable status shows the phases and the host ledger.
	out, _, code := r.CLI("status", "deployment", "c")
	if code != 0 || !strings.Contains(out, "Host ledger") || !strings.Contains(out, "gpu0") || !strings.Contains(out, "declared") {
		t.Fatalf("status c:\n%s", out)
	}
}

// TestLedger_MeasuredPeakReplacesThePlaceholder: a first start measures the
// engine's startup peak from its own processes, card and host RAM apart
// (the fake engine holds 2 GiB of weights, a 3 GiB startup transient and a
// 1 GiB KV cache on the card, and 64 MiB of host RAM); the second start
// reserves the measurement instead of the placeholder, and status says
// measured for both sides.
func TestLedger_MeasuredPeakReplacesThePlaceholder(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{})
	release := filepath.Join(r.StateDir, "release-startup")
	r.AddFakeEngine("peaky", "--sim-weights", "2GiB", "--sim-kv", "1GiB", "--sim-startup-peak", "3GiB",
		"--host-alloc", "64MiB", "--hold-startup-file", release)
	spec := gpuSpec("peaky", "peaky", "    ready {\n      gpu = \"4GiB\"\n      ram = \"32MiB\"\n    }")
	if out, errOut, code := r.Deploy("peaky", spec, "--activate"); code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s", code, out, errOut)
	}
	// While it starts: the placeholder is charged, and the sampler sees
	// the peak (the engine holds it until the release file exists).
	var mv wire.MemoryView
	harness.Eventually(t, 60*time.Second, "the sampler to see the startup peak", func() bool {
		mv = e2e.MemoryOf(t, e2e.Status(t, r, "peaky"))
		return mv.Startup.ObservedDeviceBytes >= 6*gib && mv.Startup.ObservedHostBytes >= 64<<20
	})
	if mv.Startup.DeviceBytes != 4*gib || mv.Startup.DeviceProvenance != "placeholder" || mv.Startup.HostProvenance != "placeholder" {
		t.Fatalf("first start: %+v", mv.Startup)
	}
	if mv.Startup.ObservedDeviceBytes != 6*gib {
		t.Fatalf("observed %d on the card, want the engine's 6GiB exactly", mv.Startup.ObservedDeviceBytes)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "peaky to be ready", func() bool { return e2e.Status(t, r, "peaky").State == "ready" })
	mv = e2e.MemoryOf(t, e2e.Status(t, r, "peaky"))
	if mv.Measured == nil || mv.Measured.DeviceBytes != 6*gib || mv.Measured.HostBytes < 64<<20 || mv.Measured.Provenance != "measured" {
		t.Fatalf("measurement after the first start: %+v", mv.Measured)
	}
	measuredHost := mv.Measured.HostBytes

	if _, errOut, code := r.CLI("stop", "deployment", "peaky", "--wait"); code != 0 {
		t.Fatalf("stop: %d %s", code, errOut)
	}
	if _, errOut, code := r.CLI("start", "deployment", "peaky", "--wait"); code != 0 {
		t.Fatalf("second start: %d %s\n%s", code, errOut, r.Output())
	}
	st := e2e.Status(t, r, "peaky")
	mv = e2e.MemoryOf(t, st)
	if mv.Startup.DeviceProvenance != "measured" || mv.Startup.HostProvenance != "measured" {
		t.Fatalf("second start provenance: device %q host %q", mv.Startup.DeviceProvenance, mv.Startup.HostProvenance)
	}
	if mv.Startup.DeviceBytes != 6*gib || mv.Startup.HostBytes != measuredHost {
		t.Fatalf("second start reserved %d / %d, want the measured 6GiB / %d", mv.Startup.DeviceBytes, mv.Startup.HostBytes, measuredHost)
	}
	// The raw JSON names the fields the release notes name
	// (memory.startup.device_provenance, memory.startup.host_provenance).
	out, _, _ := r.CLI("status", "deployment", "peaky", "--json")
	var raw struct {
		Memory struct {
			Startup map[string]any `json:"startup"`
		} `json:"memory"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"device_provenance", "host_provenance"} {
		if raw.Memory.Startup[k] != "measured" {
			t.Fatalf("status --json memory.startup.%s = %v:\n%s", k, raw.Memory.Startup[k], out)
		}
	}
}

// TestLedger_MultiCardPinsTheCardWithRoom: on two simulated 24 GiB cards, a
// 16 GiB deployment takes gpu0; a 10 GiB one no longer fits there and goes
// to gpu1, pinned by UUID: its engine allocates on that card.
func TestLedger_MultiCardPinsTheCardWithRoom(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{Devices: 2}, harness.Options{})
	r.AddFakeEngine("fake", "--sim-weights", "1GiB")
	r.MustDeploy("big", gpuSpec("big", "fake", "    gpu = \"16GiB\"\n    ram = \"128MiB\""))
	r.MustDeploy("mid", gpuSpec("mid", "fake", "    gpu = \"10GiB\"\n    ram = \"128MiB\""))
	devs := r.SimState().Devices
	cases := []struct {
		name string
		card string
		uuid string
	}{{"big", "gpu0", devs[0].UUID}, {"mid", "gpu1", devs[1].UUID}}
	for _, c := range cases {
		st := e2e.Status(t, r, c.name)
		in := st.Instances[0]
		if _, ok := in.Charges[c.card]; !ok || len(in.Charges) != 2 {
			t.Fatalf("%s charged %v, want %s and system", c.name, in.Charges, c.card)
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", in.PID))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(env), "CUDA_VISIBLE_DEVICES="+c.uuid+"\x00") {
			t.Fatalf("%s engine (pid %d) is not pinned to %s", c.name, in.PID, c.uuid)
		}
		found := false
		for _, a := range r.SimState().Allocations {
			if a.PID == in.PID {
				found = true
				if a.DeviceUUID != c.uuid {
					t.Fatalf("%s allocated on %s, want %s", c.name, a.DeviceUUID, c.uuid)
				}
			}
		}
		if !found {
			t.Fatalf("%s engine holds nothing on the simulated gpu", c.name)
		}
	}
	// The host ledger is served by the management API too.
	req, _ := http.NewRequest(http.MethodGet, "http://"+r.Info.Management+"/management/v1/hosts/"+r.Info.Host+"/ledger", nil)
	req.Header.Set("Authorization", "Bearer "+r.Creds.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var hl struct {
		Host   string     `json:"host"`
		GPUs   []wire.GPU `json:"gpus"`
		Ledger struct {
			Domains []struct {
				Name    string `json:"name"`
				Charged int64  `json:"charged_bytes"`
			} `json:"domains"`
			Owners []struct {
				ID string `json:"id"`
			} `json:"owners"`
		} `json:"ledger"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&hl); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("host ledger: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	charged := map[string]int64{}
	for _, d := range hl.Ledger.Domains {
		charged[d.Name] = d.Charged
	}
	if len(hl.GPUs) != 2 || charged["gpu0"] != 16*gib || charged["gpu1"] != 10*gib || charged["system"] != 256<<20 || len(hl.Ledger.Owners) != 2 {
		t.Fatalf("host ledger: %+v", hl)
	}
	if hl.GPUs[1].UsedBytes != gib {
		t.Fatalf("gpu1 used %d, want mid's engine's 1GiB", hl.GPUs[1].UsedBytes)
	}
}

// TestLedger_BadInputIsRefusedWhenWritten: sizes that do not parse,
// percentages over 100, limits that do not fit together or do not fit the
// machine, and charges above every domain's managed limit are refused when
// the deployment or the configuration is written, with a code.
func TestLedger_BadInputIsRefusedWhenWritten(t *testing.T) {
	t.Run("role configuration", func(t *testing.T) {
		sim := []string{"--gpu-provider", "simulated", "--set", "gpu.sim_device_memory=24GiB"}
		cases := []struct {
			name     string
			args     []string
			contains string
		}{
			{name: "size that does not parse", args: []string{"--set", "memory.system.managed_limit=12 gigs"}, contains: "memory.system.managed_limit"},
			{name: "percentage over 100", args: []string{"--set", "memory.system.managed_limit=150%"}, contains: "outside"},
			{name: "limits that do not fit together", args: []string{"--set", "memory.system.managed_limit=90%", "--set", "memory.system.free_reserve=20%"}, contains: "add up to more than 100%"},
			{name: "a limit larger than the machine", args: []string{"--set", "memory.system.managed_limit=1000TiB"}, contains: "above the capacity"},
			{name: "card limits that do not fit the card", args: append(sim, "--set", "memory.gpu.managed_limit=23GiB", "--set", "memory.gpu.free_reserve=2GiB"), contains: "memory.gpu.managed_limit"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				code, out := harness.StartRoleExpectingFailure(t, c.args...)
				if code != 2 || !strings.Contains(out, "invalid_config") || !strings.Contains(out, c.contains) {
					t.Fatalf("exit %d, want 2 with invalid_config and %q:\n%s", code, c.contains, out)
				}
			})
		}
	})
	t.Run("deployments", func(t *testing.T) {
		r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{})
		r.AddFakeEngine("fake")
		cases := []struct {
			name     string
			res      string
			exit     int
			code     string
			contains string
		}{
			{name: "size that does not parse", res: `    gpu = "11 gigs"`, exit: 2, code: "invalid_config", contains: "unknown unit"},
			{name: "card charge above every card's limit", res: `    gpu = "30GiB"`, exit: 4, code: "insufficient_device_memory", contains: "needs 30GiB of GPU memory"},
			{name: "startup above every card's limit", res: "    startup {\n      gpu = \"23GiB\"\n    }\n    ready {\n      gpu = \"10GiB\"\n    }", exit: 4, code: "insufficient_device_memory", contains: "manages at most 22.1GiB"},
			{name: "host charge above the host's limit", res: `    ram = "3GiB"`, exit: 4, code: "insufficient_memory", contains: "needs 3GiB of host memory"},
		}
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				name := fmt.Sprintf("bad%d", i)
				_, errOut, code := r.Deploy(name, gpuSpec(name, "fake", c.res))
				if code != c.exit || !strings.Contains(errOut, c.code) || !strings.Contains(errOut, c.contains) {
					t.Fatalf("exit %d, want %d with %s and %q:\n%s", code, c.exit, c.code, c.contains, errOut)
				}
				if _, _, code := r.CLI("status", "deployment", name); code == 0 {
					t.Fatalf("a refused deployment was written")
				}
			})
		}
		// A GPU charge on a host without a GPU is refused the same way.
		none := harness.StartStandalone(t, harness.Options{Args: []string{"--gpu-provider", "none"}})
		none.AddFakeEngine("fake")
		_, errOut, code := none.Deploy("g", gpuSpec("g", "fake", `    gpu = "1GiB"`))
		if code != 4 || !strings.Contains(errOut, "has no GPU") {
			t.Fatalf("gpu charge without a gpu: exit %d\n%s", code, errOut)
		}
	})
}
