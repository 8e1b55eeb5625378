// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// requestsServed is how many requests of dep a host's own router answered,
// from its request log (every outcome), read from its management API on
// its own loopback. Not from capyctl_requests_total: a deleted
// deployment's series are forgotten with it, and the lost host deletes
// its old copy.
func requestsServed(t *testing.T, h *harness.Role, dep string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+h.Info.Management+wire.Prefix+"/requests?limit=500&deployment="+url.QueryEscape(dep), nil)
	req.Header.Set("Authorization", "Bearer "+h.Creds.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out wire.RequestsResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the host's request log: %d %v", resp.StatusCode, err)
	}
	return len(out.Requests)
}

// rescheduleFleet is a server with host_heartbeat 300ms (a host is lost
// after 3 silent beats, 0.9-1.2 s) and reschedule_after 2s, and two hosts
// each behind a partition of its own: gpu-a (80 GiB, the most free) and
// gpu-b; demo is deployed, placed on gpu-a, and has answered there.
//
// The bounds of the waits below cover the product's own timers with
// margin for a loaded 2-core CI machine (load 8 or more): a move is due
// 0.9-1.2 s (lost) + 2 s (reschedule_after) after a cut, a blocked one is
// tried again at once when a host's link or relay comes up (else after
// 1 s, doubling), and the fake engine starts in well under a second
// unloaded. 30 s is ten times the timers.
func rescheduleFleet(t *testing.T) (f *e2e.Fleet, pa, pb *harness.Partition) {
	f = &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms", "--set", "reschedule_after=2s"}})
	f.DumpOnFailure() // the server's fleet log says when each host was lost, back, and what moved
	token, cluster := f.Server.JoinToken("")
	pa = harness.NewPartition(t, cluster)
	f.Hosts["gpu-a"] = harness.StartHostWith(t, pa.Addr(), token, harness.HostOptions{Name: "gpu-a", GPU: harness.SimGPU{DeviceMemory: "80GiB"}})
	token, cluster = f.Server.JoinToken("")
	pb = harness.NewPartition(t, cluster)
	f.Hosts["gpu-b"] = harness.StartHostWith(t, pb.Addr(), token, harness.HostOptions{Name: "gpu-b"})
	f.WaitHosts(2, wire.HostReady)
	f.Server.AddFakeEngine("fake")
	f.WaitEngine("fake")
	for _, h := range f.Hosts {
		h.WriteFile("models/demo/README", "fake model\n")
	}
	if out, errOut, code := f.Deploy("demo", harness.SimpleSpec("demo", "fake"), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}
	if hs := hostsOf(f.Status("demo")); !slices.Equal(hs, []string{"gpu-a"}) {
		t.Fatalf("demo placed on %v, want gpu-a (the most free)", hs)
	}
	e2e.ChatOK(t, f.Server, "demo")
	return f, pa, pb
}

// TestFleet_RescheduleAfterALostHost: a host cut off for longer than
// reschedule_after has its instance placed on another host that fits,
// which serves it; when the lost host comes back, its old copy is stopped
// and deleted (its share no longer names it) and it answers no request of
// the deployment in the meantime: one copy serves at any time.
func TestFleet_RescheduleAfterALostHost(t *testing.T) {
	f, proxy, _ := rescheduleFleet(t)
	a := f.Hosts["gpu-a"]

	// The request log is written in batches: gpu-a's one answer is
	// waited in before the cut.
	poll.Until(t, 10*time.Second, "gpu-a's answer in its request log", func() bool { return requestsServed(t, a, "demo") >= 1 })
	served := requestsServed(t, a, "demo")
	proxy.Cut(false)
	poll.Until(t, 30*time.Second, "demo moved to gpu-b and ready there", func() bool {
		st := f.Status("demo")
		return slices.Equal(hostsOf(st), []string{"gpu-b"}) && st.ReadyN == 1
	})
	e2e.ChatOK(t, f.Server, "demo")

	proxy.Heal()
	poll.Until(t, 30*time.Second, "gpu-a back", func() bool { return f.HostState("gpu-a") == wire.HostReady })
	for i := 0; i < 20; i++ {
		e2e.ChatOK(t, f.Server, "demo")
	}
	poll.Until(t, 30*time.Second, "gpu-a stopped and deleted its old copy", func() bool {
		return len(hostDeployments(t, a)) == 0 && len(harness.EnginePIDs(a.StateDir)) == 0
	})
	if now := requestsServed(t, a, "demo"); now != served {
		t.Fatalf("gpu-a answered %d requests of demo after it was cut off: two copies served", now-served)
	}
	if hs := hostsOf(f.Status("demo")); !slices.Equal(hs, []string{"gpu-b"}) {
		t.Fatalf("demo on %v after gpu-a's return, want gpu-b alone", hs)
	}
	if !strings.Contains(f.Server.Output(), "instances placed off a host") {
		t.Fatal("the server did not say it moved the instance")
	}
}

// TestFleet_RescheduleWhenAnotherHostIsBack: a lost host falls due while
// the only other host is out of reach too, so its instance has nowhere to
// go; it moves as soon as the other host is back. Before, the first
// blocked attempt was the only one: the instance stayed on the lost host
// until that host came back (under load, a host whose heartbeats were
// late at the wrong moment was enough).
func TestFleet_RescheduleWhenAnotherHostIsBack(t *testing.T) {
	f, pa, pb := rescheduleFleet(t)
	pa.Cut(false)
	pb.Cut(false)
	poll.Until(t, 30*time.Second, "the server's move of demo off gpu-a blocked (no other host ready)", func() bool {
		return strings.Contains(f.Server.Output(), "could not be placed elsewhere")
	})
	if hs := hostsOf(f.Status("demo")); !slices.Equal(hs, []string{"gpu-a"}) {
		t.Fatalf("demo on %v while no other host was ready, want gpu-a still", hs)
	}
	pb.Heal()
	poll.Until(t, 30*time.Second, "gpu-b back, demo moved to it and ready there", func() bool {
		st := f.Status("demo")
		return slices.Equal(hostsOf(st), []string{"gpu-b"}) && st.ReadyN == 1
	})
	e2e.ChatOK(t, f.Server, "demo")
}

// TestFleet_RetireAHost follows the several-machines guide: drain a host,
// stop its instance, remove it; the deployment's instance moves to the
// other host (before, the removal was refused conflict while the stopped
// instance was still placed there), the removed host is refused and
// stops, and its engine is gone. The guide's own commands in its order
// too: a drained host takes no new placement until drain --resume, and
// remove moves a running instance (solo's) to the other host, where it
// serves.
func TestFleet_RetireAHost(t *testing.T) {
	f := e2e.StartFleet(t, map[string]string{"gpu-a": "48GiB", "gpu-b": "24GiB"})
	for _, h := range f.Hosts {
		h.WriteFile("models/demo/README", "fake model\n")
	}
	if _, errOut, code := f.Server.CLI("drain", "host", "gpu-a"); code != 0 {
		t.Fatalf("drain host gpu-a: exit %d\n%s", code, errOut)
	}
	if out, errOut, code := f.Deploy("solo", harness.SimpleSpec("solo", "fake"), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy solo: exit %d\n%s%s", code, out, errOut)
	}
	if hs := hostsOf(f.Status("solo")); !slices.Equal(hs, []string{"gpu-b"}) {
		t.Fatalf("solo placed on %v with gpu-a drained, want gpu-b", hs)
	}
	if _, errOut, code := f.Server.CLI("drain", "host", "gpu-a", "--resume"); code != 0 {
		t.Fatalf("drain host gpu-a --resume: exit %d\n%s", code, errOut)
	}
	spec := strings.Replace(harness.SimpleSpec("demo", "fake"), "  engine = ", "  instances = 2\n  engine = ", 1)
	if out, errOut, code := f.Deploy("demo", spec, "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}
	st := f.Status("demo")
	idx := -1
	for _, in := range st.Instances {
		if in.Host == "gpu-b" {
			idx = in.Index
		}
	}
	if idx < 0 {
		t.Fatalf("no instance of demo on gpu-b: %v", hostsOf(st))
	}
	b := f.Hosts["gpu-b"]
	for _, args := range [][]string{{"drain", "host", "gpu-b"}, {"stop", "instance", "demo/" + strconv.Itoa(idx), "--wait"}, {"remove", "host", "gpu-b"}} {
		if out, errOut, code := f.Server.CLI(args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	if code := b.WaitExit(60 * time.Second); code != 3 {
		t.Fatalf("the removed host exited %d, want 3\n%s", code, b.Output())
	}
	if len(harness.EnginePIDs(b.StateDir)) != 0 {
		t.Fatalf("engines left on the removed host: %v", harness.EnginePIDs(b.StateDir))
	}
	if _, errOut, code := f.Server.CLI("start", "deployment", "demo", "--wait"); code != 0 {
		t.Fatalf("start demo after the retirement: exit %d\n%s", code, errOut)
	}
	st = f.Status("demo")
	if len(st.Instances) != 2 || !slices.Equal(hostsOf(st), []string{"gpu-a", "gpu-a"}) || st.ReadyN != 2 {
		t.Fatalf("demo after gpu-b's retirement: %d instances on %v, %d ready", len(st.Instances), hostsOf(st), st.ReadyN)
	}
	e2e.ChatOK(t, f.Server, "demo")
	poll.Until(t, 30*time.Second, "solo, running on gpu-b, moved to gpu-a and ready", func() bool {
		st := f.Status("solo")
		return slices.Equal(hostsOf(st), []string{"gpu-a"}) && st.ReadyN == 1
	})
	e2e.ChatOK(t, f.Server, "solo")
}
