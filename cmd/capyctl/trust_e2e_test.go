// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/runinfo"
	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// dashboardWorks logs in to the dashboard at mgmt with the admin token
// over fresh connections and reads the session back; it returns what
// failed, "" when all answered.
func dashboardWorks(mgmt, token string) string {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	base := "http://" + mgmt
	resp, err := hc.Get(base + "/dashboard/")
	if err != nil {
		return "GET /dashboard/: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "GET /dashboard/: " + resp.Status
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/dashboard/login", strings.NewReader(`{"token":"`+token+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = hc.Do(req)
	if err != nil {
		return "POST /dashboard/login: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "POST /dashboard/login: " + resp.Status
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/dashboard/session", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = hc.Do(req)
	if err != nil {
		return "GET /dashboard/session: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "GET /dashboard/session: " + resp.Status
	}
	return ""
}

// TestManagement_LocalFloodLocksNoOperatorOut (M5): any local user can
// open connections to the management listener's loopback port. With 600
// idle ones from 127.0.0.1 (the CLI's and the browser's address) and 300
// more from other loopback addresses held open, the CLI still answers
// (through the role's Unix socket, which only the role's user opens) and
// the dashboard still logs in (its requests take the idle connections'
// slots); with 600 more that each sent a byte, the CLI still answers.
// Before, 512 idle connections made the CLI report
// role_not_running and the dashboard stop answering.
func TestManagement_LocalFloodLocksNoOperatorOut(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	sock := filepath.Join(r.StateDir, runinfo.ManagementSocketFile)
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("management socket %s: %v %v, want mode 0600", sock, st, err)
	}
	one := attack.OpenFlood(attack.FloodOptions{Target: r.Info.Management, PerSource: 600})
	defer one.Close()
	many := attack.OpenFlood(attack.FloodOptions{Target: r.Info.Management, PerSource: 10, Sources: attack.Loopback(2, 30)})
	defer many.Close()
	t.Logf("flood: %d+%d idle connections open", one.Opened(), many.Opened())
	if one.Opened() < 512 {
		t.Fatalf("the flood opened %d connections from 127.0.0.1, want over 512", one.Opened())
	}
	if out, errOut, code := r.CLI("status"); code != 0 {
		t.Fatalf("capyctl status under the flood: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := r.CLI("list", "deployments"); code != 0 {
		t.Fatalf("capyctl list deployments under the flood: exit %d\n%s%s", code, out, errOut)
	}
	if why := dashboardWorks(r.Info.Management, r.Creds.AdminToken); why != "" {
		t.Fatalf("the dashboard under the flood: %s", why)
	}
	// A flood that sends a byte on each connection (a request begun and
	// never finished) is not idle: its slots are held until the header
	// deadline. The CLI still answers, through the socket.
	drip := attack.OpenFlood(attack.FloodOptions{Target: r.Info.Management, PerSource: 600, Send: []byte("G")})
	defer drip.Close()
	if out, errOut, code := r.CLI("status"); code != 0 {
		t.Fatalf("capyctl status under a flood of begun requests: exit %d\n%s%s", code, out, errOut)
	}
}

// TestGroups_PeerAddressNeverGuessed (M7): a group's traffic is
// unauthenticated, so its link is the operator's to name: a group placed
// across a host without peer_address is refused with
// peer_address_missing, naming that host, instead of meeting on the
// interface that reaches the server.
func TestGroups_PeerAddressNeverGuessed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, two hosts and group engines")
	}
	f := &fleet{t: t, hosts: map[string]*harness.Role{}}
	f.server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	gpu := harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}
	f.hosts["gpu-a"] = harness.StartHost(t, f.server, harness.HostOptions{Name: "gpu-a", GPU: gpu})
	// gpu-b says nothing of its group link.
	f.hosts["gpu-b"] = harness.StartHost(t, f.server, harness.HostOptions{Name: "gpu-b", GPU: gpu,
		Options: harness.Options{Args: []string{"--set", "peer_address="}}})
	f.waitHosts(2, wire.HostReady)
	vllm := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := f.server.CLI("engine", "add", vllm, "--name", "vllm", "--yes"); code != 0 {
		t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
	}
	f.waitEngine("vllm")
	spec := groupSpec("pair", "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "8GiB", "8GiB"))
	out, errOut, code := f.deployEverywhere("pair", spec)
	if code == 0 || !strings.Contains(out+errOut, "peer_address_missing") || !strings.Contains(out+errOut, "gpu-b") {
		t.Fatalf("a group across a host without peer_address: exit %d, want peer_address_missing naming gpu-b\n%s%s", code, out, errOut)
	}
	for name, h := range f.hosts {
		if out, _, _ := h.CLI("list", "deployments", "--json"); strings.Contains(out, `"pair"`) {
			t.Fatalf("a refused group left a member on %s: %s", name, out)
		}
	}
}
