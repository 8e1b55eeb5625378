// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package groups_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// groupMemory is each member's charge: two do not fit on one 24 GiB card.
const groupMemory = `  engine_config {
    memory {
      request = "%s"
      startup = "%s"
    }
  }
`

// groupSpec is a deployment across hosts.
func groupSpec(name, engine string, tp int, hosts []string, extra string) string {
	return fmt.Sprintf(`deployment %q {
  engine = %q
  topology {
    tensor_parallel = %d
  }
  placement {
    hosts = ["%s"]
  }
  model {
    path = "%s/model"
  }
%s}
`, name, engine, tp, strings.Join(hosts, `", "`), name, extra)
}

// groupPIDs are the engine processes of a group's members, by host.
func groupPIDs(st wire.DeploymentStatus) map[string]int {
	out := map[string]int{}
	for _, in := range st.Instances {
		out[in.Host] = in.PID
	}
	return out
}

// TestFleetGroups_AcrossHosts runs the scenario with a server and
// three hosts, each a separate process, engines the testkit's fakes in
// group mode: a 2-host vLLM group and a 3-host SGLang group come up and
// answer; five park and wake cycles of the vLLM group (each wake with its
// wake check); a killed head and a killed worker stop the whole group,
// which the server does itself (the fake vLLM, as vLLM, leaves the other
// rank running); a
// host agent that goes away leaves its member uncertain with its charge,
// then launched again; the group alternates with another model under
// --evict; a stop while a host agent is away answers, and the agent stops
// its member from its share once back; no engine is left behind and no
// ledger ever goes over a limit.
func TestFleetGroups_AcrossHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, three hosts and group engines")
	}
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	f := e2e.StartFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB", "gpu-c": "24GiB"})
	step("fleet up")
	f.DumpOnFailure()
	vllm := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := f.Server.CLI("engine", "add", vllm, "--name", "vllm", "--yes"); code != 0 {
		t.Fatalf("engine add vllm: exit %d\n%s%s", code, out, errOut)
	}
	sglang := conformance.FakeVenv(t, t.TempDir(), map[string]string{"sglang": "0.5.22"}, nil)
	if out, errOut, code := f.Server.CLI("engine", "add", sglang, "--name", "sglang", "--yes"); code != 0 {
		t.Fatalf("engine add sglang: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitEngine("vllm")
	f.WaitEngine("sglang")

	step("engines added")

	// Refusals at deploy time, each with its code.
	if _, errOut, code := f.DeployEverywhere("odd", groupSpec("odd", "vllm", 3, []string{"gpu-a", "gpu-b"}, "")); code != 2 || !strings.Contains(errOut, "group_topology_invalid") {
		t.Fatalf("tensor_parallel 3 over 2 hosts: exit %d: %s", code, errOut)
	}
	if _, errOut, code := f.DeployEverywhere("one", groupSpec("one", "vllm", 2, []string{"gpu-a"}, "")); code != 2 || !strings.Contains(errOut, "group_placement_required") {
		t.Fatalf("a topology on one host: exit %d: %s", code, errOut)
	}
	if _, errOut, code := f.DeployEverywhere("deep-sg", groupSpec("deep-sg", "sglang", 2, []string{"gpu-a", "gpu-b"}, "  residency = \"deep\"\n"), "--activate"); code != 5 ||
		!strings.Contains(errOut, "capability_missing:deep_park") {
		t.Fatalf("an SGLang group that parks deep: exit %d: %s", code, errOut)
	}
	if out, _, _ := f.Server.CLI("list", "deployments", "--json"); strings.Contains(out, "deep-sg") {
		t.Fatalf("a refused group left a placement: %s", out)
	}

	step("refusals")

	// Bring-up: a 2-host vLLM group and a 3-host SGLang group answer.
	big := groupSpec("big", "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "14GiB", "14GiB"))
	if out, errOut, code := f.DeployEverywhere("big", big, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy big: exit %d\n%s%s", code, out, errOut)
	}
	st := f.WaitGroup("big", "ready", 60*time.Second)
	if st.Group == nil || st.Group.Size != 2 || st.Group.PeerTransport != "unauthenticated" || st.State != "ready" || st.ReadyN != 2 {
		t.Fatalf("big's status: state %s ready %d group %+v", st.State, st.ReadyN, st.Group)
	}
	for rank, in := range st.Instances {
		if in.Rank == nil || *in.Rank != rank || in.Host != []string{"gpu-a", "gpu-b"}[rank] || len(in.Charges) == 0 {
			t.Fatalf("big's member %d: %+v", rank, in)
		}
	}
	if st.Instances[0].Role != "head" || st.Instances[1].Role != "worker" {
		t.Fatalf("roles: %s, %s", st.Instances[0].Role, st.Instances[1].Role)
	}
	e2e.ChatOK(t, f.Server, "big")
	out, _, code := f.Server.CLI("status", "deployment", "big")
	if code != 0 || !strings.Contains(out, "unauthenticated") || !strings.Contains(out, "gpu-b") {
		t.Fatalf("status deployment big: exit %d\n%s", code, out)
	}

	step("big ready")

	wide := groupSpec("wide", "sglang", 3, []string{"gpu-c", "gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "4GiB", "4GiB"))
	if out, errOut, code := f.DeployEverywhere("wide", wide, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy wide: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitGroup("wide", "ready", 60*time.Second)
	e2e.ChatOK(t, f.Server, "wide")
	f.LedgersWithinLimits("after bring-up")

	step("wide ready")

	// Five park and wake cycles of the vLLM group: parked, each member
	// holds what it measured; the wake answers its wake check.
	for cycle := 1; cycle <= 5; cycle++ {
		if _, errOut, code := f.Server.CLI("park", "deployment", "big", "--wait"); code != 0 {
			t.Fatalf("cycle %d: park: exit %d: %s", cycle, code, errOut)
		}
		st := f.WaitGroup("big", "parked", 30*time.Second)
		for _, in := range st.Instances {
			if in.Phase != "parked" {
				t.Fatalf("cycle %d: member on %s parked in ledger phase %q", cycle, in.Host, in.Phase)
			}
		}
		f.LedgersWithinLimits(fmt.Sprintf("cycle %d parked", cycle))
		if cycle%2 == 1 {
			if _, errOut, code := f.Server.CLI("start", "deployment", "big", "--wait"); code != 0 {
				t.Fatalf("cycle %d: wake: exit %d: %s", cycle, code, errOut)
			}
		}
		e2e.ChatOK(t, f.Server, "big") // an even cycle wakes on the request itself
		f.WaitGroup("big", "ready", 30*time.Second)
		f.LedgersWithinLimits(fmt.Sprintf("cycle %d ready", cycle))
	}

	step("five cycles")

	// A killed head stops the whole group (vLLM's headless worker does not
	// notice and waits: the server stops it); it starts again.
	pids := groupPIDs(f.Status("big"))
	if err := syscall.Kill(pids["gpu-a"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.NoGroupEngine(pids)
	f.WaitGroupStopped("big", "group_member_failed")
	if _, errOut, code := f.Server.CLI("start", "deployment", "big", "--wait"); code != 0 {
		t.Fatalf("start after the head's death: exit %d: %s", code, errOut)
	}
	f.WaitGroup("big", "ready", 60*time.Second)
	e2e.ChatOK(t, f.Server, "big")

	step("head killed and restarted")

	// A killed worker too. vLLM's head does not notice a lost rank until
	// its next collective (the fake hangs as it does): only the server's
	// supervision of every rank stops it.
	pids = groupPIDs(f.Status("big"))
	if err := syscall.Kill(pids["gpu-b"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.NoGroupEngine(pids)
	f.WaitGroupStopped("big", "group_member_failed")
	if st := f.Status("big"); st.Group == nil || st.Group.LastError == nil || !strings.Contains(st.Group.LastError.Message, "rank 1 on gpu-b") {
		t.Fatalf("the group stopped for its worker names another cause: %+v", st.Group)
	}
	if _, errOut, code := f.Server.CLI("start", "deployment", "big", "--wait"); code != 0 {
		t.Fatalf("start after the worker's death: exit %d: %s", code, errOut)
	}
	f.WaitGroup("big", "ready", 60*time.Second)
	e2e.ChatOK(t, f.Server, "big")

	step("worker killed and restarted")

	// A host agent that goes away: its member reads uncertain at once,
	// charge kept; back with its journal, the same engine, launched again.
	pids = groupPIDs(f.Status("big"))
	b := f.Hosts["gpu-b"]
	b.Kill9()
	poll.Until(t, 10*time.Second, "big's worker uncertain", func() bool {
		st := f.Status("big")
		w := st.Instances[1]
		return w.State == "uncertain" && w.LastError != nil && w.LastError.Code == "group_member_uncertain" && len(w.Charges) > 0
	})
	if !harness.Alive(pids["gpu-b"]) || !harness.Alive(pids["gpu-a"]) {
		t.Fatalf("the group's engines did not survive the host agent's death")
	}
	b.Restart()
	poll.Until(t, 30*time.Second, "gpu-b back", func() bool { return f.HostState("gpu-b") == wire.HostReady })
	st = f.WaitGroup("big", "ready", 30*time.Second)
	if got := groupPIDs(st); got["gpu-b"] != pids["gpu-b"] || got["gpu-a"] != pids["gpu-a"] {
		t.Fatalf("the group's engines changed across the agent's restart: %v, were %v", got, pids)
	}
	e2e.ChatOK(t, f.Server, "big")

	step("agent back")

	// A new revision of the group (deploy of a changed spec): the whole
	// group restarts on it, the old engines gone, and status shows the
	// new revision. A revision no host can run (a member larger than its
	// card) is refused and the old revision runs again; one that moves
	// the group to other hosts is refused before anything stops.
	revised := func(ctx int, request string) string {
		return groupSpec("big", "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(
			"  engine_config {\n    context_length = %d\n    memory {\n      request = %q\n      startup = %q\n    }\n  }\n", ctx, request, request))
	}
	pids = groupPIDs(f.Status("big"))
	if out, errOut, code := f.DeployEverywhere("big", revised(4096, "14GiB"), "--wait"); code != 0 || !strings.Contains(out, "revision 2") {
		t.Fatalf("deploy big's revision 2: exit %d\n%s%s", code, out, errOut)
	}
	f.NoGroupEngine(pids)
	st = f.WaitGroup("big", "ready", 60*time.Second)
	if st.Revision != 2 || st.Spec == nil || st.Spec.EngineConfig.ContextLength != 4096 {
		t.Fatalf("big after its new revision: revision %d spec %+v", st.Revision, st.Spec)
	}
	e2e.ChatOK(t, f.Server, "big")
	if out, _, code := f.Server.CLI("status", "deployment", "big"); code != 0 || !strings.Contains(out, "Revision:  2") {
		t.Fatalf("status deployment big after its new revision: exit %d\n%s", code, out)
	}
	_, errOut, code := f.DeployEverywhere("big", revised(4096, "30GiB"))
	t.Logf("a revision larger than the cards: exit %d: %s", code, strings.TrimSpace(errOut))
	if code == 0 || !strings.Contains(errOut, "the old revision runs again") {
		t.Fatalf("a revision larger than the cards: exit %d: %s", code, errOut)
	}
	if st = f.WaitGroup("big", "ready", 60*time.Second); st.Revision != 2 || st.Spec == nil || st.Spec.EngineConfig.ContextLength != 4096 {
		t.Fatalf("big after a refused revision: revision %d spec %+v", st.Revision, st.Spec)
	}
	e2e.ChatOK(t, f.Server, "big")
	pids = groupPIDs(st)
	moved := strings.Replace(revised(2048, "14GiB"), `"gpu-a", "gpu-b"`, `"gpu-b", "gpu-a"`, 1)
	if _, errOut, code := f.DeployEverywhere("big", moved); code != 5 || !strings.Contains(errOut, "unsupported") {
		t.Fatalf("a revision on other hosts: exit %d: %s", code, errOut)
	}
	if got := groupPIDs(f.Status("big")); got["gpu-a"] != pids["gpu-a"] || got["gpu-b"] != pids["gpu-b"] {
		t.Fatalf("a revision refused before anything stops restarted the group: %v, were %v", got, pids)
	}

	step("revised")

	// Alternate the group with another model on gpu-b under --evict.
	solo := fmt.Sprintf("deployment \"solo\" {\n  engine = \"vllm\"\n  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {\n    path = \"solo/model\"\n  }\n%s}\n",
		fmt.Sprintf(groupMemory, "14GiB", "14GiB"))
	if out, errOut, code := f.DeployEverywhere("solo", solo); code != 0 {
		t.Fatalf("deploy solo: exit %d\n%s%s", code, out, errOut)
	}
	for round := 0; round < 2; round++ {
		if _, errOut, code := f.Server.CLI("start", "deployment", "solo", "--evict", "--wait"); code != 0 {
			t.Fatalf("round %d: start solo --evict: exit %d: %s", round, code, errOut)
		}
		if st := f.Status("big"); st.State != "parked" {
			t.Fatalf("round %d: big is %s (%v) after solo took its room", round, st.State, e2e.MemberStates(st))
		}
		e2e.ChatOK(t, f.Server, "solo")
		f.LedgersWithinLimits(fmt.Sprintf("round %d solo", round))
		if _, errOut, code := f.Server.CLI("start", "deployment", "big", "--evict", "--wait"); code != 0 {
			t.Fatalf("round %d: start big --evict: exit %d: %s", round, code, errOut)
		}
		if st := f.Status("solo"); st.State == "ready" {
			t.Fatalf("round %d: solo still ready beside the group", round)
		}
		e2e.ChatOK(t, f.Server, "big")
		f.LedgersWithinLimits(fmt.Sprintf("round %d big", round))
	}

	step("alternated")

	// A stop while a member's host agent is away answers at once: the
	// head stops now; the worker stops from its host's share of the
	// desired state as soon as the agent is back (its engine outlives the
	// agent meanwhile).
	pids = groupPIDs(f.Status("big"))
	b.Kill9()
	poll.Until(t, 10*time.Second, "big's worker uncertain", func() bool { return f.Status("big").Instances[1].State == "uncertain" })
	if _, errOut, code := f.Server.CLI("stop", "deployment", "big", "--wait"); code != 0 {
		t.Fatalf("stop big with gpu-b's agent away: exit %d: %s", code, errOut)
	}
	f.NoGroupEngine(map[string]int{"gpu-a": pids["gpu-a"]})
	if !harness.Alive(pids["gpu-b"]) {
		t.Fatal("the worker's engine ended while its host agent was away: this test no longer shows the agent's return stops it")
	}
	b.Restart()
	f.NoGroupEngine(map[string]int{"gpu-b": pids["gpu-b"]})
	poll.Until(t, 30*time.Second, "big stopped on both hosts", func() bool {
		states := e2e.MemberStates(f.Status("big"))
		return len(states) == 2 && states[0] == "stopped" && states[1] == "stopped"
	})

	step("stopped with an agent away")

	// Delete everything: no engine process left on any host.
	for _, name := range []string{"big", "wide", "solo"} {
		if _, errOut, code := f.Server.CLI("delete", "deployment", name); code != 0 {
			t.Fatalf("delete %s: exit %d: %s", name, code, errOut)
		}
	}
	for name, h := range f.Hosts {
		poll.Until(t, 30*time.Second, "no engine left on "+name, func() bool { return len(harness.EnginePIDs(h.StateDir)) == 0 })
	}
}

// TestFleetGroups_StallAndRefusals: a shape an engine cannot run (a
// TensorFold group of tensor_parallel 4) is refused with nothing left
// behind; a bring-up whose head never becomes ready is stopped after
// group_stall_timeout (group_stalled) with no engine left; a member no
// host ledger admits refuses the deploy naming its host and leaves no
// member behind.
func TestFleetGroups_StallAndRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, two hosts and group engines")
	}
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms", "--set", "group_stall_timeout=3s"}})
	for _, name := range []string{"gpu-a", "gpu-b"} {
		f.Hosts[name] = harness.StartHost(t, f.Server, harness.HostOptions{Name: name,
			GPU: harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}})
	}
	f.WaitHosts(2, wire.HostReady)
	f.DumpOnFailure()
	hold := filepath.Join(t.TempDir(), "never")
	vllm := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	for _, e := range [][]string{{"vllm"}, {"vllm-stuck", "--env", "CAPYCTL_FAKE_HOLD_STARTUP_FILE=" + hold}} {
		args := append([]string{"engine", "add", vllm, "--name", e[0], "--yes"}, e[1:]...)
		if out, errOut, code := f.Server.CLI(args...); code != 0 {
			t.Fatalf("engine add %s: exit %d\n%s%s", e[0], code, out, errOut)
		}
		f.WaitEngine(e[0])
	}
	tf := f.Hosts["gpu-a"].FakeTensorFoldVenv("tf", "0.6.5", true)
	if out, errOut, code := f.Server.CLI("engine", "add", tf, "--name", "tf", "--yes"); code != 0 {
		t.Fatalf("engine add tf: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitEngine("tf")

	// A shape the engine cannot run: TensorFold runs tensor_parallel 2 on
	// exactly two machines. Refused at the deploy, before any member
	// starts, and nothing is left behind.
	wide := groupSpec("wide-tf", "tf", 4, []string{"gpu-a", "gpu-b"}, "  engine_config {\n    context_length = 4096\n  }\n  resources {\n    gpu = \"2GiB\"\n    ram = \"1GiB\"\n  }\n")
	if out, errOut, code := f.DeployEverywhere("wide-tf", wide, "--activate"); code != 5 || !strings.Contains(errOut, "group_shape_unsupported:tensorfold") {
		t.Fatalf("a TensorFold group of tensor_parallel 4: exit %d, want 5 group_shape_unsupported:tensorfold\nout: %s\nerr: %s", code, out, errOut)
	}
	if out, _, _ := f.Server.CLI("list", "deployments", "--json"); strings.Contains(out, `"wide-tf"`) {
		t.Fatalf("a refused shape left a placement: %s", out)
	}
	for name, h := range f.Hosts {
		if out, _, _ := h.CLI("list", "deployments", "--json"); strings.Contains(out, `"wide-tf"`) {
			t.Fatalf("a refused shape left a member on %s: %s", name, out)
		}
		if pids := harness.EnginePIDs(h.StateDir); len(pids) != 0 {
			t.Fatalf("engines run on %s after a refused shape: %v", name, pids)
		}
	}

	// A stalled bring-up: the head loads for ever.
	stuck := groupSpec("stuck", "vllm-stuck", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "8GiB", "8GiB"))
	if out, errOut, code := f.DeployEverywhere("stuck", stuck, "--activate", "--wait"); code != 13 || !strings.Contains(errOut, "group_stalled") {
		t.Fatalf("deploy stuck --wait: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitGroupStopped("stuck", "group_stalled")
	for name, h := range f.Hosts {
		poll.Until(t, 30*time.Second, "no engine left on "+name, func() bool { return len(harness.EnginePIDs(h.StateDir)) == 0 })
	}
	if _, errOut, code := f.Server.CLI("delete", "deployment", "stuck"); code != 0 {
		t.Fatalf("delete stuck: exit %d: %s", code, errOut)
	}

	// A member gpu-b's ledger cannot admit: refused naming gpu-b, and the
	// head made on gpu-a is gone again.
	huge := groupSpec("huge", "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "14GiB", "14GiB"))
	filler := fmt.Sprintf("deployment \"filler\" {\n  engine = \"vllm\"\n  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {\n    path = \"filler/model\"\n  }\n  lifecycle {\n    warm = true\n  }\n%s}\n",
		fmt.Sprintf(groupMemory, "14GiB", "14GiB"))
	if out, errOut, code := f.DeployEverywhere("filler", filler, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy filler: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code := f.DeployEverywhere("huge", huge, "--activate")
	if code != 4 || !strings.Contains(errOut, "capacity_blocked") || !strings.Contains(errOut, "rank 1 on host gpu-b") {
		t.Fatalf("a member gpu-b cannot fit: exit %d: %s", code, errOut)
	}
	if out, _, _ := f.Server.CLI("list", "deployments", "--json"); strings.Contains(out, `"huge"`) {
		t.Fatalf("a refused group left a placement: %s", out)
	}
	// The head's removal reaches gpu-a as desired state (the refusal does
	// not wait for the host to act on it): it goes within a bound.
	poll.Until(t, 15*time.Second, "the refused group's head gone from gpu-a", func() bool {
		out, _, code := f.Hosts["gpu-a"].CLI("list", "deployments", "--json")
		return code == 0 && !strings.Contains(out, `"huge"`)
	})

	// Two groups that do not fit together: an operator's --evict starts
	// the stopped one by parking the other (a cold start, whose refusal is
	// read from the member's record), and back (a wake).
	if _, errOut, code := f.Server.CLI("delete", "deployment", "filler"); code != 0 {
		t.Fatalf("delete filler: exit %d: %s", code, errOut)
	}
	for _, name := range []string{"one", "two"} {
		spec := groupSpec(name, "vllm", 2, []string{"gpu-a", "gpu-b"}, fmt.Sprintf(groupMemory, "14GiB", "14GiB"))
		if out, errOut, code := f.DeployEverywhere(name, spec); code != 0 {
			t.Fatalf("deploy %s: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	if _, errOut, code := f.Server.CLI("start", "deployment", "one", "--wait"); code != 0 {
		t.Fatalf("start one: exit %d: %s", code, errOut)
	}
	if _, errOut, code := f.Server.CLI("start", "deployment", "two", "--wait"); code != 4 || !strings.Contains(errOut, "capacity_blocked") {
		t.Fatalf("start two without --evict: exit %d: %s", code, errOut)
	}
	for round := 0; round < 2; round++ {
		for _, pair := range [][2]string{{"two", "one"}, {"one", "two"}} {
			if _, errOut, code := f.Server.CLI("start", "deployment", pair[0], "--evict", "--wait"); code != 0 {
				a, b := f.Status(pair[0]), f.Status(pair[1])
				t.Fatalf("round %d: start %s --evict: exit %d: %s\n%s: %v %+v\n%s: %v", round, pair[0], code, errOut,
					pair[0], e2e.MemberStates(a), a.Instances, pair[1], e2e.MemberStates(b))
			}
			if st := f.Status(pair[1]); st.State != "parked" {
				t.Fatalf("round %d: %s is %s (%v) after %s took its room", round, pair[1], st.State, e2e.MemberStates(st), pair[0])
			}
			e2e.ChatOK(t, f.Server, pair[0])
			f.LedgersWithinLimits(fmt.Sprintf("round %d %s", round, pair[0]))
		}
	}

	// A topology deployed on a host itself is the server's to place.
	direct := f.Hosts["gpu-a"]
	direct.WriteFile("models/direct/README", "fake model\n")
	if _, errOut, code := direct.Deploy("direct", groupSpec("direct", "vllm", 2, []string{"gpu-a", "gpu-b"}, "")); code != 5 || !strings.Contains(errOut, "unsupported") {
		t.Fatalf("a topology deployed on a host: exit %d: %s", code, errOut)
	}
}
