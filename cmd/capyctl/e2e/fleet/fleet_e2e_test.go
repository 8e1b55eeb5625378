// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
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

// hostsOf lists the hosts of a deployment's instances, in order.
func hostsOf(st wire.DeploymentStatus) []string {
	var out []string
	for _, in := range st.Instances {
		out = append(out, in.Host)
	}
	return out
}

// sameAsHosts checks that the server shows each instance of deployment
// name as its host's own status does (from the journal the host pushed):
// its process, its ledger phase and charges (some, with charged), its
// timings. The server's copy trails the host's by one journal push
// (milliseconds, more under load): a change the host made between the
// two reads is in flight, so both are read again until they agree, for
// up to 30 s; the last difference fails the test.
func sameAsHosts(t *testing.T, f *e2e.Fleet, name string, charged bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		diff := differsFromHosts(t, f, f.Status(name), charged)
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(diff)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// differsFromHosts is how the server's status st differs from its hosts'
// own ("": it does not).
func differsFromHosts(t *testing.T, f *e2e.Fleet, st wire.DeploymentStatus, charged bool) string {
	t.Helper()
	if len(st.Instances) == 0 {
		return fmt.Sprintf("%s: the server shows no instance", st.Name)
	}
	for _, in := range st.Instances {
		own, err := f.Hosts[in.Host].Mgmt.Deployment(context.Background(), st.Name)
		if err != nil || len(own.Instances) != 1 {
			return fmt.Sprintf("%s on %s: %v %+v", st.Name, in.Host, err, own)
		}
		h := own.Instances[0]
		if in.PID == 0 || in.PID != h.PID || in.Port != h.Port || in.Engine != h.Engine || in.Phase != h.Phase ||
			!maps.Equal(in.Charges, h.Charges) || (charged && len(in.Charges) == 0) ||
			in.Timings == nil || h.Timings == nil || in.Timings.StartMs != h.Timings.StartMs {
			return fmt.Sprintf("%s's instance on %s: the server shows %+v, the host %+v", st.Name, in.Host, in, h)
		}
	}
	return ""
}

// firstState is the state of a deployment's first instance as the server
// shows it ("" with none: a poll reads on).
func firstState(st wire.DeploymentStatus) string {
	if len(st.Instances) == 0 {
		return ""
	}
	return st.Instances[0].State
}

func TestFleet_ServerAndThreeHosts(t *testing.T) {
	f := e2e.StartFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB", "gpu-c": "80GiB"})

	// Every host joined over mutual TLS with its own certificate.
	for _, h := range f.HostList() {
		if !h.Online || h.CertExpiresAt == nil || h.LastSeen == nil || len(h.GPUs) != 1 || !slices.Contains(h.Engines, "fake") {
			t.Fatalf("host %+v: want online, a certificate expiry, a last-seen time, one card and the fake engine", h)
		}
	}

	// Two replicas spread over two hosts, the one with the most free card
	// memory first; requests go through the server's relay.
	spec := strings.Replace(harness.SimpleSpec("demo", "fake"), "  engine = ", "  instances = 2\n  engine = ", 1)
	if out, errOut, code := f.Deploy("demo", spec, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s\nserver:\n%s", code, out, errOut, f.Server.Output())
	}
	st := f.Status("demo")
	hs := hostsOf(st)
	if len(hs) != 2 || hs[0] != "gpu-c" || hs[0] == hs[1] || st.ReadyN != 2 {
		t.Fatalf("demo placed on %v (ready %d), want gpu-c first and two distinct hosts, both ready", hs, st.ReadyN)
	}
	sameAsHosts(t, f, "demo", false)
	e2e.ChatOK(t, f.Server, "demo")
	resp, err := f.Server.Chat(context.Background(), harness.ChatBody("demo", true, "hello"), map[string]string{"X-Request-Id": "client-7"})
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "data: [DONE]") || resp.Header.Get("X-Request-Id") != "client-7" ||
		resp.Header.Get("X-CapyCTL-Request-Id") == "" {
		t.Fatalf("streamed chat through the server: %d %v %s", resp.StatusCode, resp.Header, body)
	}

	// The management views answer for the whole fleet: the snapshot lists
	// the hosts and the deployment, the load view numbers demo's instances
	// deployment-wide.
	for i := 0; i < 4; i++ {
		e2e.ChatOK(t, f.Server, "demo") // ties go round the hosts: both replicas answer
	}
	snap, err := f.Server.Mgmt.Snapshot(context.Background())
	if err != nil || len(snap.Hosts) != 3 || len(snap.Deployments) != 1 || snap.Role.Role != "server" {
		t.Fatalf("snapshot: %v %+v", err, snap)
	}
	var load wire.LoadResponse
	f.MgmtGet("/management/v1/metrics/load", &load)
	if len(load.Deployments) != 1 || len(load.Deployments[0].Requests.Instances) != 2 ||
		load.Deployments[0].Requests.Instances[0].ID != "demo/0" || load.Deployments[0].Requests.Instances[1].ID != "demo/1" {
		t.Fatalf("load view: %+v", load)
	}

	// An update reaches every host of the deployment; one that changes the
	// number of instances spreads them anew.
	spec2 := strings.Replace(spec, "  model {", "  engine_config {\n    max_concurrent_requests = 16\n  }\n  model {", 1)
	if out, errOut, code := f.Deploy("demo", spec2, "--revision", "1", "--wait"); code != 0 {
		t.Fatalf("update demo: exit %d\n%s%s", code, out, errOut)
	}
	if st := f.Status("demo"); st.Revision != 2 || len(st.Instances) != 2 || st.Instances[0].Revision != 2 || st.Instances[1].Revision != 2 {
		t.Fatalf("demo after the update: revision %d, instances %+v", st.Revision, st.Instances)
	}
	spec3 := strings.Replace(spec2, "instances = 2", "instances = 3", 1)
	if out, errOut, code := f.Deploy("demo", spec3, "--revision", "2", "--wait"); code != 0 {
		t.Fatalf("an update to 3 instances: exit %d\n%s%s", code, out, errOut)
	}
	if st := f.Status("demo"); st.Revision != 3 || len(st.Instances) != 3 || len(hostsOf(st)) != 3 {
		t.Fatalf("demo after the update to 3 instances: revision %d, hosts %v", st.Revision, hostsOf(st))
	}
	spec2 = strings.Replace(spec3, "instances = 3", "instances = 2", 1)
	if out, errOut, code := f.Deploy("demo", spec2, "--revision", "3", "--wait"); code != 0 {
		t.Fatalf("an update back to 2 instances: exit %d\n%s%s", code, out, errOut)
	}

	// placement.hosts pins a deployment; a spec no host has room for is
	// capacity_blocked, naming each host's refusal.
	pinned := strings.Replace(harness.SimpleSpec("pinned", "fake"), "  model {", "  placement {\n    hosts = [\"gpu-a\"]\n  }\n  model {", 1)
	if out, errOut, code := f.Deploy("pinned", pinned, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy pinned: exit %d\n%s%s", code, out, errOut)
	}
	if hs := hostsOf(f.Status("pinned")); len(hs) != 1 || hs[0] != "gpu-a" {
		t.Fatalf("pinned placed on %v, want [gpu-a]", hs)
	}
	// A route another deployment answers is refused, whichever host each
	// would run on.
	clash := strings.Replace(harness.SimpleSpec("clash", "fake"), "  model {", "  routes = [\"demo\"]\n  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {", 1)
	if _, errOut, code := f.Deploy("clash", clash, "--activate"); code == 0 || !strings.Contains(errOut, "conflict") {
		t.Fatalf("a second deployment answering demo: exit %d: %s", code, errOut)
	}
	huge := strings.Replace(harness.SimpleSpec("huge", "fake"), "  model {", "  resources {\n    gpu = \"200GiB\"\n    ram = \"1GiB\"\n  }\n  model {", 1)
	_, errOut, code := f.Deploy("huge", huge, "--activate", "--json")
	if code != 4 || !strings.Contains(errOut, "capacity_blocked") || !strings.Contains(errOut, "gpu-a") || !strings.Contains(errOut, "gpu-c") {
		t.Fatalf("huge: exit %d, want 4 capacity_blocked naming every host\n%s", code, errOut)
	}

	// Park and wake through the server: the request wakes the instance on
	// its host, and the host's events reach the server's journal.
	ectx, ecancel := context.WithTimeout(context.Background(), 30*time.Second)
	events, err := f.Server.Mgmt.Events(ectx, snap.Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := f.Server.CLI("park", "deployment", "pinned", "--wait"); code != 0 {
		t.Fatalf("park pinned: exit %d\n%s%s", code, out, errOut)
	}
	for {
		ev, err := events.Next()
		if err != nil {
			t.Fatalf("waiting for gpu-a's instance_stopped (park) on the server's event stream: %v", err)
		}
		// The fake custom engine is restart only: its park stops it.
		if ev.Kind == "instance_stopped" && ev.Payload["host"] == "gpu-a" && ev.Payload["deployment"] == "pinned" && ev.Payload["why"] == "operator park" {
			break
		}
	}
	events.Close()
	ecancel()
	if st := f.Status("pinned"); st.State != "parked" && st.State != "stopped" {
		t.Fatalf("pinned after park: %s", st.State)
	}
	e2e.ChatOK(t, f.Server, "pinned")

	// Two vLLM models that do not fit on gpu-b's card together: asking one
	// and then the other switches them on that host (the first parks deep).
	venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := f.Server.CLI("engine", "add", venv, "--name", "vllm", "--yes", "--env", "CAPYCTL_FAKE_SIM_WEIGHTS=8GiB"); code != 0 {
		t.Fatalf("engine add vllm: exit %d\n%s%s", code, out, errOut)
	}
	for _, name := range []string{"chat-a", "chat-b"} {
		conformance.FakeModel(t, filepath.Join(f.Hosts["gpu-b"].StateDir, "models", name), 1<<20)
		spec := fmt.Sprintf("deployment %q {\n  engine = \"vllm\"\n  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {\n    path = \"%s/model\"\n  }\n%s}\n", name, name, e2e.SwitchMemory)
		if out, errOut, code := f.Server.Deploy(name, spec); code != 0 {
			t.Fatalf("deploy %s: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	e2e.ChatOK(t, f.Server, "chat-a")
	e2e.ChatOK(t, f.Server, "chat-b")
	// The server's status is what the host pushed (its journals): a
	// transition the answer raced reaches it milliseconds later.
	var a, b wire.DeploymentStatus
	poll.Until(t, 30*time.Second, "chat-a parked and chat-b ready", func() bool {
		a, b = f.Status("chat-a"), f.Status("chat-b")
		return firstState(a) == "parked" && firstState(b) == "ready"
	})
	if a.Instances[0].Host != "gpu-b" || b.Instances[0].Host != "gpu-b" {
		t.Fatalf("after chat-b: chat-a %s on %s, chat-b %s on %s; want parked and ready on gpu-b",
			a.Instances[0].State, a.Instances[0].Host, b.Instances[0].State, b.Instances[0].Host)
	}
	sameAsHosts(t, f, "chat-b", true)
	e2e.ChatOK(t, f.Server, "chat-a") // and back: chat-a wakes, chat-b parks
	poll.Until(t, 30*time.Second, "chat-a ready after its request", func() bool { return firstState(f.Status("chat-a")) == "ready" })

	// A host agent that goes away: its instance reads uncertain, requests
	// go to the other replica, and it comes back with its journal, its
	// engine never restarted.
	c := f.Hosts["gpu-c"]
	enginesBefore := harness.EnginePIDs(c.StateDir)
	if len(enginesBefore) == 0 {
		t.Fatalf("no engine process under gpu-c's state directory")
	}
	c.Kill9()
	poll.Until(t, 15*time.Second, "gpu-c lost", func() bool { return f.HostState("gpu-c") == wire.HostLost })
	st = f.Status("demo")
	if st.Instances[0].State != "uncertain" || st.Instances[1].State != "ready" {
		t.Fatalf("demo with gpu-c lost: %+v", st.Instances)
	}
	for i := 0; i < 4; i++ {
		e2e.ChatOK(t, f.Server, "demo") // the replica on the other host answers
	}
	c.Restart()
	poll.Until(t, 30*time.Second, "gpu-c ready again", func() bool { return f.HostState("gpu-c") == wire.HostReady })
	poll.Until(t, 30*time.Second, "demo ready on both hosts", func() bool { return f.Status("demo").ReadyN == 2 })
	for _, pid := range enginesBefore {
		if !harness.Alive(pid) {
			t.Fatalf("engine %d on gpu-c did not survive its host agent's restart", pid)
		}
	}

	// A server restart loses no deployment and restarts no engine; the
	// hosts reconnect by themselves.
	all := map[int]bool{}
	for _, h := range f.Hosts {
		for _, pid := range harness.EnginePIDs(h.StateDir) {
			all[pid] = true
		}
	}
	f.Server.Stop()
	f.Server.Restart()
	f.WaitHosts(3, wire.HostReady)
	for _, name := range []string{"demo", "pinned"} {
		if st := f.Status(name); st.ReadyN == 0 {
			t.Fatalf("%s after a server restart: %+v", name, st)
		}
	}
	e2e.ChatOK(t, f.Server, "demo")
	for pid := range all {
		if !harness.Alive(pid) {
			t.Fatalf("engine %d did not survive the server's restart", pid)
		}
	}

	// Drain: no new placement on gpu-b, running ones stay.
	if _, errOut, code := f.Server.CLI("drain", "host", "gpu-b"); code != 0 {
		t.Fatalf("drain host: exit %d: %s", code, errOut)
	}
	if out, errOut, code := f.Deploy("third", harness.SimpleSpec("third", "fake"), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy third: exit %d\n%s%s", code, out, errOut)
	}
	if hs := hostsOf(f.Status("third")); len(hs) != 1 || hs[0] == "gpu-b" {
		t.Fatalf("third placed on %v, not on the draining gpu-b", hs)
	}
	onB := strings.Replace(harness.SimpleSpec("on-b", "fake"), "  model {", "  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {", 1)
	if _, errOut, code := f.Deploy("on-b", onB, "--activate"); code != 4 || !strings.Contains(errOut, "host_draining") {
		t.Fatalf("a deployment pinned to the draining host: exit %d: %s", code, errOut)
	}

	// Delete through the server stops the engines on the hosts.
	for _, name := range []string{"demo", "pinned", "third", "chat-a", "chat-b"} {
		if _, errOut, code := f.Server.CLI("delete", "deployment", name); code != 0 {
			t.Fatalf("delete %s: exit %d: %s", name, code, errOut)
		}
	}
	for name, h := range f.Hosts {
		poll.Until(t, 30*time.Second, "no engine left on "+name, func() bool { return len(harness.EnginePIDs(h.StateDir)) == 0 })
	}
}

// TestFleet_PartitionHeals cuts a host off the server with a proxy that
// stops carrying traffic (nothing is closed), then heals it: the server
// finds the host lost and places nothing there, requests for its model
// fail fast, and once healed the host reconnects with its journal, its
// engine neither restarted nor started twice.
func TestFleet_PartitionHeals(t *testing.T) {
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	f.Hosts["gpu-a"] = harness.StartHost(t, f.Server, harness.HostOptions{Name: "gpu-a"})
	token, cluster := f.Server.JoinToken("")
	proxy := harness.NewPartition(t, cluster)
	f.Hosts["gpu-b"] = harness.StartHostWith(t, proxy.Addr(), token, harness.HostOptions{Name: "gpu-b", GPU: harness.SimGPU{DeviceMemory: "80GiB"}})
	f.WaitHosts(2, wire.HostReady)
	f.Server.AddFakeEngine("fake")
	f.WaitEngine("fake")
	pinned := strings.Replace(harness.SimpleSpec("demo", "fake"), "  model {", "  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {", 1)
	if out, errOut, code := f.Deploy("demo", pinned, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}
	b := f.Hosts["gpu-b"]
	engines := harness.EnginePIDs(b.StateDir)
	if len(engines) != 1 {
		t.Fatalf("engines on gpu-b: %v, want one", engines)
	}
	chargedBefore := f.HostCharged("gpu-b")

	proxy.Cut(false)
	poll.Until(t, 15*time.Second, "gpu-b lost", func() bool { return f.HostState("gpu-b") == wire.HostLost })
	// Requests for its model fail fast, coded, with Retry-After.
	resp, err := f.Server.Chat(context.Background(), harness.ChatBody("demo", false, "hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "host_unreachable") {
		t.Fatalf("request during the partition: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// Nothing is placed on the lost host. (A delete meanwhile is taken:
	// the host deletes its copy when it is back, TestFleet_DeleteWhileAHostIsAway.)
	more := strings.Replace(harness.SimpleSpec("more", "fake"), "  model {", "  placement {\n    hosts = [\"gpu-b\"]\n  }\n  model {", 1)
	if _, errOut, code := f.Deploy("more", more, "--activate"); code != 4 || !strings.Contains(errOut, "capacity_blocked") {
		t.Fatalf("deploy on the lost host: exit %d: %s", code, errOut)
	}
	if st := f.Status("demo"); st.Instances[0].State != "uncertain" {
		t.Fatalf("demo during the partition: %+v", st.Instances)
	}

	proxy.Heal()
	poll.Until(t, 30*time.Second, "gpu-b back", func() bool { return f.HostState("gpu-b") == wire.HostReady })
	poll.Until(t, 30*time.Second, "demo ready again", func() bool { return f.Status("demo").ReadyN == 1 })
	e2e.ChatOK(t, f.Server, "demo")
	if now := harness.EnginePIDs(b.StateDir); len(now) != 1 || now[0] != engines[0] {
		t.Fatalf("engines on gpu-b after the partition: %v, before %v: restarted or started twice", now, engines)
	}
	if len(harness.EnginePIDs(f.Hosts["gpu-a"].StateDir)) != 0 {
		t.Fatal("an engine started on gpu-a during the partition")
	}
	if charged := f.HostCharged("gpu-b"); charged != chargedBefore {
		t.Fatalf("gpu-b's ledger charges %d after the partition, %d before", charged, chargedBefore)
	}
}

// TestFleet_JoinRefusals drives the refusals an operator meets through the
// processes: a token used twice, a host restarted under another name, and
// a removed host, which the server refuses on every new connection.
func TestFleet_JoinRefusals(t *testing.T) {
	server := harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	token, cluster := server.JoinToken("")
	host := harness.StartHostWith(t, cluster, token, harness.HostOptions{Name: "gpu-a"})
	f := &e2e.Fleet{T: t, Server: server, Hosts: map[string]*harness.Role{"gpu-a": host}}
	f.WaitHosts(1, wire.HostReady)

	bin, _ := harness.Binaries(t)
	_, errOut, code := harness.RunCLI(t, bin, []string{"start", "host", "--state-dir", t.TempDir(), "--server", cluster, "--hostname", "gpu-b",
		"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0", "--gpu-provider", "simulated"}, []string{"CAPYCTL_JOIN_TOKEN=" + token})
	if code != 3 || !strings.Contains(errOut, "join_token_used") {
		t.Fatalf("a second host with a used token: exit %d: %s", code, errOut)
	}

	// A deployment made on the host itself (its own loopback management
	// API) is adopted by the server: listed and routed.
	host.AddFakeEngine("fake")
	host.MustDeploy("local", harness.SimpleSpec("local", "fake"))
	poll.Until(t, 15*time.Second, "the server adopts the host's own deployment", func() bool {
		out, _, code := server.CLI("list", "deployments")
		return code == 0 && strings.Contains(out, "local")
	})
	if st := f.Status("local"); len(st.Instances) != 1 || st.Instances[0].Host != "gpu-a" || st.ReadyN != 1 {
		t.Fatalf("adopted deployment: %+v", st)
	}
	e2e.ChatOK(t, server, "local")
	if _, errOut, code := server.CLI("delete", "deployment", "local"); code != 0 {
		t.Fatalf("delete the adopted deployment: exit %d: %s", code, errOut)
	}

	host.Stop()
	_, errOut, code = harness.RunCLI(t, bin, []string{"start", "host", "--state-dir", host.StateDir, "--server", cluster, "--hostname", "gpu-renamed",
		"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0", "--gpu-provider", "simulated"}, nil)
	if code != 2 || !strings.Contains(errOut, "host_name_changed") {
		t.Fatalf("the host restarted under another name: exit %d: %s", code, errOut)
	}
	host.Restart()
	f.WaitHosts(1, wire.HostReady)

	if _, errOut, code := server.CLI("remove", "host", "gpu-a"); code != 0 {
		t.Fatalf("remove host: exit %d: %s", code, errOut)
	}
	if hs := f.HostList(); len(hs) != 0 {
		t.Fatalf("hosts after the removal: %+v", hs)
	}
	poll.Until(t, 15*time.Second, "the removed host told it is refused", func() bool {
		return strings.Contains(host.Output(), "the server refuses this host's certificate")
	})
	poll.Until(t, 30*time.Second, "the removed host's role stops (host_revoked)", host.Exited)
	if !strings.Contains(host.Output(), "host_revoked") {
		t.Fatalf("the removed host stopped without host_revoked:\n%s", host.Output())
	}
	if hs := f.HostList(); len(hs) != 0 {
		t.Fatalf("the removed host came back: %+v", hs)
	}
}
