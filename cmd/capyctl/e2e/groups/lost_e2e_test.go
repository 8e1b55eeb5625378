// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package groups_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestFleetGroups_ALostHostStopsTheGroup: a group with a member on a host
// lost for longer than reschedule_after cannot move (its placement names
// its hosts): the leader stops it whole and it stays down, its status
// saying why (group_member_uncertain, naming the host and
// reschedule_after). The head's engine stops; nothing starts on the host
// that would fit (gpu-c). When the lost host is back, it stops its worker
// from its share; the group stays stopped until an operator starts it,
// and then answers again.
func TestFleetGroups_ALostHostStopsTheGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, three hosts and group engines")
	}
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms", "--set", "reschedule_after=2s"}})
	gpu := harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}
	token, cluster := f.Server.JoinToken("")
	proxy := harness.NewPartition(t, cluster)
	f.Hosts["gpu-b"] = harness.StartHostWith(t, proxy.Addr(), token, harness.HostOptions{Name: "gpu-b", GPU: gpu})
	for _, name := range []string{"gpu-a", "gpu-c"} {
		f.Hosts[name] = harness.StartHost(t, f.Server, harness.HostOptions{Name: name, GPU: gpu})
	}
	f.WaitHosts(3, wire.HostReady)
	f.DumpOnFailure()
	vllm := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := f.Server.CLI("engine", "add", vllm, "--name", "vllm", "--yes"); code != 0 {
		t.Fatalf("engine add vllm: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitEngine("vllm")

	big := groupSpec("big", "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "14GiB", "14GiB"))
	if out, errOut, code := f.DeployEverywhere("big", big, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy big: exit %d\n%s%s", code, out, errOut)
	}
	pids := groupPIDs(f.WaitGroup("big", "ready", 60*time.Second))
	e2e.ChatOK(t, f.Server, "big")

	// gpu-b cut off: lost, then past reschedule_after.
	proxy.Cut(false)
	var st wire.DeploymentStatus
	poll.Until(t, 30*time.Second, "big stopped by the lost host, the reason in its status", func() bool {
		st = f.Status("big")
		e := st.Group
		return e != nil && e.LastError != nil && string(e.LastError.Code) == "group_member_uncertain" &&
			strings.Contains(e.LastError.Message, "gpu-b") && strings.Contains(e.LastError.Message, "reschedule_after") &&
			len(st.Instances) == 2 && st.Instances[0].State == "stopped"
	})
	t.Logf("big's reason: %s", st.Group.LastError.Message)
	f.NoGroupEngine(map[string]int{"gpu-a": pids["gpu-a"]})
	if hs := st.Group.Hosts; !slices.Equal(hs, []string{"gpu-a", "gpu-b"}) {
		t.Fatalf("big moved to %v: a group stays on its hosts", hs)
	}
	if got := harness.EnginePIDs(f.Hosts["gpu-c"].StateDir); len(got) != 0 {
		t.Fatalf("engines started on gpu-c for the lost group: %v", got)
	}
	if !harness.Alive(pids["gpu-b"]) {
		t.Fatal("the worker's engine ended while its host was cut off: this test no longer shows its return stops it")
	}

	// Back: its worker stops from its share; the group stays down.
	proxy.Heal()
	poll.Until(t, 30*time.Second, "gpu-b back", func() bool { return f.HostState("gpu-b") == wire.HostReady })
	f.NoGroupEngine(map[string]int{"gpu-b": pids["gpu-b"]})
	f.WaitGroupStopped("big", "group_member_uncertain")
	for name, h := range f.Hosts {
		if got := harness.EnginePIDs(h.StateDir); len(got) != 0 {
			t.Fatalf("engines on %s with big down: %v", name, got)
		}
	}

	if _, errOut, code := f.Server.CLI("start", "deployment", "big", "--wait"); code != 0 {
		t.Fatalf("start big once gpu-b is back: exit %d: %s", code, errOut)
	}
	f.WaitGroup("big", "ready", 60*time.Second)
	e2e.ChatOK(t, f.Server, "big")
}
