// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestFirstHour_GPUFound: under gpu.provider = auto the banner, the log
// and capyctl status name every GPU found, or say "no GPU found (<why>)"
// on a machine without NVML, as this test machine (CI) is.
func TestFirstHour_GPUFound(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{Args: []string{"--gpu-provider", "auto"}})
	status, errOut, code := r.CLI("status")
	if code != 0 {
		t.Fatalf("status: exit %d %s", code, errOut)
	}
	jsonOut, _, _ := r.CLI("status", "--json")
	var snap struct {
		Role struct {
			GPU *struct {
				Provider string `json:"provider"`
				Driver   string `json:"driver"`
				Devices  []struct {
					Name       string `json:"name"`
					TotalBytes int64  `json:"total_bytes"`
				} `json:"devices"`
				NoGPU string `json:"no_gpu"`
			} `json:"gpu"`
			ModelsRoot string `json:"models_root"`
		} `json:"role"`
	}
	if err := json.Unmarshal([]byte(jsonOut), &snap); err != nil || snap.Role.GPU == nil {
		t.Fatalf("status --json names no GPU inventory: %v\n%s", err, jsonOut)
	}
	g := snap.Role.GPU
	if snap.Role.ModelsRoot == "" || !strings.Contains(status, "Models:      "+snap.Role.ModelsRoot) {
		t.Fatalf("status does not say where models live (%q):\n%s", snap.Role.ModelsRoot, status)
	}
	banner := r.Output()
	if len(g.Devices) == 0 {
		// No NVML here: all three say so, with NVML's reason.
		// The reason is NVML's own answer (or the build's), not a blank.
		if g.Provider != "none" || !strings.Contains(strings.ToLower(g.NoGPU), "nvml") {
			t.Fatalf("inventory without a GPU names no reason from NVML: %+v", g)
		}
		line := "no GPU found (" + g.NoGPU + ")"
		if !strings.Contains(banner, "GPUs:        "+line) {
			t.Fatalf("the banner does not say %q:\n%s", line, banner)
		}
		if !strings.Contains(status, "GPUs:        "+line) {
			t.Fatalf("status does not say %q:\n%s", line, status)
		}
		reason, _ := json.Marshal(g.NoGPU)
		if !strings.Contains(banner, `"@message":"no GPU found"`) || !strings.Contains(banner, `"reason":`+string(reason)) {
			t.Fatalf("the log does not say no GPU was found, and why:\n%s", banner)
		}
		return
	}
	// A GPU machine: every card with its model, memory and the driver.
	for _, d := range g.Devices {
		want := d.Name + ", " + structs.FormatBytes(d.TotalBytes) + ", driver " + g.Driver
		if g.Driver == "" || !strings.Contains(banner, want) || !strings.Contains(status, want) {
			t.Fatalf("%q not in the banner or status:\n%s\n%s", want, banner, status)
		}
	}
}

// TestFirstHour_AddressInUse: a busy address is its own code
// (address_in_use, exit 29, retryable; the units restart on it), and the
// message names the flag that chooses another one.
func TestFirstHour_AddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	info := structs.Lookup(structs.CodeAddressInUse)
	if info.Exit != 29 || !info.Retryable {
		t.Fatalf("address_in_use is %+v, want exit 29, retryable", info)
	}
	cases := []struct{ flag, other string }{
		{"--listen", "--management-listen"},
		{"--management-listen", "--listen"},
	}
	for _, c := range cases {
		t.Run(c.flag, func(t *testing.T) {
			dir := t.TempDir()
			_, errOut, code := run(t, nil, "start", "standalone", "--state-dir", dir, "--gpu-provider", "none",
				c.flag, addr, c.other, "127.0.0.1:0", "--json")
			if code != info.Exit {
				t.Fatalf("start on a busy %s: exit %d, want %d\n%s", c.flag, code, info.Exit, errOut)
			}
			// The role logged before it failed: the error is the last line.
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if got := errorJSON(t, "busy address", lines[len(lines)-1]+"\n"); got != string(structs.CodeAddressInUse) {
				t.Fatalf("code %s, want address_in_use\n%s", got, errOut)
			}
			if !strings.Contains(errOut, c.flag) || !strings.Contains(errOut, addr) || !strings.Contains(errOut, `"retryable":true`) {
				t.Fatalf("the message does not name %s and %s, or is not retryable:\n%s", c.flag, addr, errOut)
			}
		})
	}
	// capyctl help exit-codes explains 29.
	out, _, code := run(t, nil, "help", "exit-codes")
	want(t, "help exit-codes", code, 0, out, "Exit 29: ", "address_in_use", "--listen")
	if _, ok := exitMeaning(29); !ok {
		t.Fatal("exit 29 has no meaning of its own")
	}
}

// exitMeaning is the meaning capyctl help exit-codes gives an exit code.
func exitMeaning(exit int) (string, bool) {
	for _, r := range command.ExitCodes() {
		if r.Exit == exit {
			return r.Meaning, r.Meaning != "" && !strings.HasPrefix(r.Meaning, strconv.Itoa(exit))
		}
	}
	return "", false
}
