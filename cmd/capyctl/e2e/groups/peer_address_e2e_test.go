// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package groups_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestGroups_PeerAddressNeverGuessed (M7): a group's traffic is
// unauthenticated, so its link is the operator's to name: a group placed
// across a host without peer_address is refused with
// peer_address_missing, naming that host, instead of meeting on the
// interface that reaches the server.
func TestGroups_PeerAddressNeverGuessed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, two hosts and group engines")
	}
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	gpu := harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}
	f.Hosts["gpu-a"] = harness.StartHost(t, f.Server, harness.HostOptions{Name: "gpu-a", GPU: gpu})
	// gpu-b says nothing of its group link.
	f.Hosts["gpu-b"] = harness.StartHost(t, f.Server, harness.HostOptions{Name: "gpu-b", GPU: gpu,
		Options: harness.Options{Args: []string{"--set", "peer_address="}}})
	f.WaitHosts(2, wire.HostReady)
	vllm := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := f.Server.CLI("engine", "add", vllm, "--name", "vllm", "--yes"); code != 0 {
		t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitEngine("vllm")
	spec := groupSpec("pair", "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "8GiB", "8GiB"))
	out, errOut, code := f.DeployEverywhere("pair", spec)
	if code == 0 || !strings.Contains(out+errOut, "peer_address_missing") || !strings.Contains(out+errOut, "gpu-b") {
		t.Fatalf("a group across a host without peer_address: exit %d, want peer_address_missing naming gpu-b\n%s%s", code, out, errOut)
	}
	for name, h := range f.Hosts {
		if out, _, _ := h.CLI("list", "deployments", "--json"); strings.Contains(out, `"pair"`) {
			t.Fatalf("a refused group left a member on %s: %s", name, out)
		}
	}
}
