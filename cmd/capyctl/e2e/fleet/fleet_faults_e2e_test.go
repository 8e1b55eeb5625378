// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/freeze"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// The tests below try to break a fleet (a server and hosts, each a real
// capyctl process on loopback) and check that nothing is lost, nothing
// starts twice and every refusal is coded.

// startFaultFleet is startFleet with extra fake-engine arguments and extra
// server arguments.
func startFaultFleet(t *testing.T, cards map[string]string, serverArgs []string, engineArgs ...string) *e2e.Fleet {
	t.Helper()
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: append([]string{"--set", "host_heartbeat=300ms"}, serverArgs...)})
	for name, mem := range cards {
		f.Hosts[name] = harness.StartHost(t, f.Server, harness.HostOptions{Name: name,
			GPU: harness.SimGPU{DeviceMemory: mem, SystemLimit: "16GiB", SystemReserve: "1GiB"}})
	}
	f.WaitHosts(len(cards), wire.HostReady)
	f.Server.AddFakeEngine("fake", engineArgs...)
	f.WaitEngine("fake")
	return f
}

// waitReached waits for a call of MgmtDoReached to reach the server's
// handler; an answer first (a refusal before the body was read) fails.
func waitReached(t *testing.T, what string, reached <-chan struct{}, answer <-chan e2e.MgmtAnswer) {
	t.Helper()
	select {
	case <-reached:
	case a := <-answer:
		t.Fatalf("%s: answered before the body was read: %v %d %s", what, a.Err, a.Status, a.Body)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not within 30s", what)
	}
}

// errorCode is the catalogue code of a management or inference error
// envelope ("" when the body is not one).
func errorCode(body string) string {
	var env wire.ErrorEnvelope
	if json.Unmarshal([]byte(body), &env) != nil {
		return ""
	}
	return env.Error.Code
}

// hostDeployments lists what a host itself runs, through the host's own
// loopback management API.
func hostDeployments(t *testing.T, h *harness.Role) []wire.DeploymentStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := h.Mgmt.Deployments(ctx)
	if err != nil {
		t.Fatalf("list the host's own deployments: %v", err)
	}
	return list
}

// hostInstances counts the instances of a deployment a host itself holds
// (any state but stopped).
func hostInstances(t *testing.T, h *harness.Role, name string) int {
	t.Helper()
	n := 0
	for _, d := range hostDeployments(t, h) {
		if d.Name != name {
			continue
		}
		for _, in := range d.Instances {
			if in.State != "stopped" {
				n++
			}
		}
	}
	return n
}

func withInstancesLine(spec string, n int) string {
	return strings.Replace(spec, "  engine = ", fmt.Sprintf("  instances = %d\n  engine = ", n), 1)
}

func pinnedTo(spec string, hosts ...string) string {
	q := make([]string, len(hosts))
	for i, h := range hosts {
		q[i] = fmt.Sprintf("%q", h)
	}
	return strings.Replace(spec, "  model {", "  placement {\n    hosts = ["+strings.Join(q, ", ")+"]\n  }\n  model {", 1)
}

func withGPU(spec, gpu string) string {
	return strings.Replace(spec, "  model {", "  resources {\n    gpu = \""+gpu+"\"\n    ram = \"1GiB\"\n  }\n  model {", 1)
}

// TestFleetFaults_DeployRetriedWithSameKey deploys through the server's
// management API with an Idempotency-Key and retries it with the same key
// while the first call is still placing, and again once it is done: every
// retry replays the first answer, and each host runs exactly one instance,
// started once. The first call is held at the hosts (their drivers stopped
// with SIGSTOP, so the hosts' Plan of the deployment waits) until the
// server's handler of the retry reads its body (the answer to Expect:
// 100-continue): the two calls overlap in the server, and a retry not
// serialised behind the first by its key would place a second time or be
// refused as a conflict.
func TestFleetFaults_DeployRetriedWithSameKey(t *testing.T) {
	f := startFaultFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB"}, nil)
	for _, h := range f.Hosts {
		h.WriteFile("models/idem/README", "fake model\n")
	}
	body := `{"deployment": {"name": "idem", "engine": "fake", "instances": 2, "model": {"path": "idem"}}, "activate": true}`
	key := map[string]string{"Idempotency-Key": "fleet-faults-idem-1"}

	var drivers []int
	for _, h := range f.Hosts {
		drivers = append(drivers, harness.DriverPIDs(h.StateDir, "custom")...)
	}
	if len(drivers) < len(f.Hosts) {
		t.Fatalf("custom drivers %v, want one per host", drivers)
	}
	resume := func() {
		for _, pid := range drivers {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	for _, pid := range drivers {
		freeze.Process(t, pid)
	}

	first, second := make(chan e2e.MgmtAnswer, 1), make(chan e2e.MgmtAnswer, 1)
	inFirst, inSecond := make(chan struct{}), make(chan struct{})
	go func() { first <- f.MgmtDoReached(http.MethodPost, wire.Prefix+"/deployments", key, body, inFirst) }()
	waitReached(t, "the server to take the first deploy", inFirst, first)
	go func() { second <- f.MgmtDoReached(http.MethodPost, wire.Prefix+"/deployments", key, body, inSecond) }()
	waitReached(t, "the server to take the retry", inSecond, second)
	select {
	case a := <-first:
		t.Fatalf("the first deploy answered before the retry reached the server (%d %s): the calls did not overlap", a.Status, a.Body)
	default:
	}
	resume()
	a1, a2 := <-first, <-second
	if a1.Header.Get(wire.HeaderReplayed) == "true" && a2.Header.Get(wire.HeaderReplayed) == "" {
		// Whichever took the key first placed; the other waits for it.
		a1, a2 = a2, a1
	}
	if a1.Err != nil || a1.Status != http.StatusCreated || a1.Header.Get(wire.HeaderReplayed) != "" {
		t.Fatalf("first deploy: %v %d (replayed %q) %s\nserver:\n%s", a1.Err, a1.Status, a1.Header.Get(wire.HeaderReplayed), a1.Body, f.Server.Output())
	}
	if a2.Err != nil || a2.Status != a1.Status || a2.Header.Get(wire.HeaderReplayed) != "true" || a2.Body != a1.Body {
		t.Errorf("a retry with the same key while the first was placing: %v %d (replayed %q) %s\nwant the first answer replayed: %d %s",
			a2.Err, a2.Status, a2.Header.Get(wire.HeaderReplayed), a2.Body, a1.Status, a1.Body)
	}
	a3 := f.MgmtDo(http.MethodPost, wire.Prefix+"/deployments", key, body)
	if a3.Err != nil || a3.Status != a1.Status || a3.Header.Get(wire.HeaderReplayed) != "true" || a3.Body != a1.Body {
		t.Errorf("a retry with the same key after the first: %v %d (replayed %q) %s\nwant the first answer replayed: %d %s",
			a3.Err, a3.Status, a3.Header.Get(wire.HeaderReplayed), a3.Body, a1.Status, a1.Body)
	}
	// The same key with another body is idempotency_conflict.
	other := strings.Replace(body, `"instances": 2`, `"instances": 1`, 1)
	if a4 := f.MgmtDo(http.MethodPost, wire.Prefix+"/deployments", key, other); a4.Status != http.StatusConflict || errorCode(a4.Body) != "idempotency_conflict" {
		t.Errorf("the same key with another body: %d %s, want 409 idempotency_conflict", a4.Status, a4.Body)
	}

	// One instance per host, started once.
	poll.UntilSlow(t, 30*time.Second, "idem ready on both hosts", func() bool { return f.Status("idem").ReadyN == 2 })
	st := f.Status("idem")
	if hs := hostsOf(st); len(hs) != 2 || hs[0] == hs[1] {
		t.Fatalf("idem placed on %v, want two distinct hosts", hs)
	}
	pids := map[string][]int{}
	for name, h := range f.Hosts {
		if n := hostInstances(t, h, "idem"); n != 1 {
			t.Errorf("host %s runs %d instances of idem, want 1", name, n)
		}
		pids[name] = harness.EnginePIDs(h.StateDir)
	}
	if len(pids["gpu-a"]) == 0 || len(pids["gpu-a"]) != len(pids["gpu-b"]) {
		t.Errorf("engine processes per host: %v, want the same count (one instance) on each", pids)
	}
	e2e.ChatOK(t, f.Server, "idem")
	for name, h := range f.Hosts {
		if now := harness.EnginePIDs(h.StateDir); !slices.Equal(now, pids[name]) {
			t.Errorf("engines on %s changed: %v, then %v", name, pids[name], now)
		}
	}
}

// TestFleetFaults_ConcurrentDeploysNeverOvercommit races four deployments
// that each take most of one host's card (two pinned to gpu-a, two free to
// go anywhere) over two such hosts: exactly one lands on each host, every
// other is refused capacity_blocked, and no host's ledger is ever charged
// over its room.
func TestFleetFaults_ConcurrentDeploysNeverOvercommit(t *testing.T) {
	f := startFaultFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB"}, nil)
	specs := map[string]string{}
	for _, name := range []string{"pin-1", "pin-2"} {
		specs[name] = pinnedTo(withGPU(harness.SimpleSpec(name, "fake"), "14GiB"), "gpu-a")
	}
	for _, name := range []string{"any-1", "any-2"} {
		specs[name] = withGPU(harness.SimpleSpec(name, "fake"), "14GiB")
	}
	for name := range specs {
		for _, h := range f.Hosts {
			h.WriteFile("models/"+name+"/README", "fake model\n")
		}
	}

	type result struct {
		name, out, errOut string
		code              int
	}
	results := make(chan result, len(specs))
	var over atomic.Value
	var readings atomic.Int64 // rounds that read both ledgers
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // sample the ledgers while the deploys race
		defer close(sampled)
		for {
			read := true
			for _, h := range []string{"gpu-a", "gpu-b"} {
				if msg, ok := f.LedgerWithinLimits(h); !ok {
					over.Store(msg)
					read = false
				}
			}
			if read {
				readings.Add(1)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	for name, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, errOut, code := f.Server.Deploy(name, spec, "--activate", "--wait")
			results <- result{name, out, errOut, code}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	close(results)

	placed := map[string]string{} // deployment → host
	for r := range results {
		if r.code == 0 {
			hs := hostsOf(f.Status(r.name))
			if len(hs) != 1 {
				t.Errorf("%s placed on %v, want one host", r.name, hs)
				continue
			}
			placed[r.name] = hs[0]
			continue
		}
		if r.code != 4 || !strings.Contains(r.errOut, "capacity_blocked") {
			t.Errorf("%s: exit %d, want 0 or 4 capacity_blocked\n%s%s", r.name, r.code, r.out, r.errOut)
		}
	}
	t.Logf("placed: %v", placed)
	perHost := map[string]int{}
	for name, host := range placed {
		perHost[host]++
		if strings.HasPrefix(name, "pin-") && host != "gpu-a" {
			t.Errorf("%s, pinned to gpu-a, landed on %s", name, host)
		}
	}
	if perHost["gpu-a"] != 1 || perHost["gpu-b"] > 1 {
		t.Errorf("deployments per host %v: each host has room for one", perHost)
	}
	if placed["any-1"] == "" && placed["any-2"] == "" && perHost["gpu-b"] == 0 {
		t.Errorf("both unpinned deployments refused while gpu-b had room: %v", placed)
	}
	if msg, _ := over.Load().(string); msg != "" {
		t.Errorf("a ledger went over its room, or could not be read, while the deploys raced: %s", msg)
	}
	if readings.Load() == 0 {
		t.Error("the sampler read no ledger while the deploys raced: it proves nothing")
	}
	// What each host runs is what the server placed: no refused deployment
	// left behind on a host.
	for hname, h := range f.Hosts {
		for _, d := range hostDeployments(t, h) {
			if placed[d.Name] != hname {
				t.Errorf("host %s holds deployment %s (%s), which the server placed on %q", hname, d.Name, d.State, placed[d.Name])
			}
		}
		if msg, ok := f.LedgerWithinLimits(hname); !ok {
			t.Error(msg)
		}
	}
	var list wire.DeploymentList
	out, errOut, code := f.Server.CLI("list", "deployments", "--json")
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("list deployments: exit %d: %s%s", code, out, errOut)
	}
	if len(list.Deployments) != len(placed) {
		t.Errorf("the server lists %d deployments, %d were placed: %s", len(list.Deployments), len(placed), out)
	}
}

// TestFleetFaults_HostKilledDuringActivation deploys a model pinned to a
// host and kills the host agent (SIGKILL) while the engine is still
// loading. The host answers a deploy once it has recorded it (201,
// starting), so the deploy is placed; the host's death leaves it
// uncertain, nothing starts elsewhere, and when the host comes back its
// journal reconciles the instance: one engine, never two, and ready.
func TestFleetFaults_HostKilledDuringActivation(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "release")
	f := startFaultFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB"}, nil, "--hold-startup-file", hold)
	a := f.Hosts["gpu-a"]
	if out, errOut, code := f.Deploy("mid", pinnedTo(harness.SimpleSpec("mid", "fake"), "gpu-a"), "--activate"); code != 0 {
		t.Fatalf("deploy mid: exit %d\n%s%s", code, out, errOut)
	}
	poll.Until(t, 30*time.Second, "mid's engine loading on gpu-a", func() bool { return len(harness.EnginePIDs(a.StateDir)) > 0 })
	a.Kill9()
	poll.UntilSlow(t, 15*time.Second, "gpu-a lost", func() bool { return f.HostState("gpu-a") == wire.HostLost })
	if st := f.Status("mid"); len(st.Instances) != 1 || st.Instances[0].State != "uncertain" || st.Instances[0].Host != "gpu-a" {
		t.Fatalf("mid with gpu-a dead: %+v, want one uncertain instance on gpu-a", st.Instances)
	}
	resp, err := f.Server.Chat(context.Background(), harness.ChatBody("mid", false, "hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := harness.ReadAll(resp); resp.StatusCode != http.StatusServiceUnavailable || errorCode(body) != "host_unreachable" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a request for mid with its host dead: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if len(harness.EnginePIDs(f.Hosts["gpu-b"].StateDir)) != 0 {
		t.Fatal("an engine started on gpu-b for a deployment pinned to gpu-a")
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a.Restart()
	f.WaitHosts(2, wire.HostReady)
	poll.UntilSlow(t, 60*time.Second, "mid ready after gpu-a came back", func() bool { return f.Status("mid").ReadyN == 1 })
	if n := hostInstances(t, a, "mid"); n != 1 {
		t.Fatalf("gpu-a runs %d instances of mid, want 1", n)
	}
	engines := harness.EnginePIDs(a.StateDir)
	e2e.ChatOK(t, f.Server, "mid")
	if now := harness.EnginePIDs(a.StateDir); !slices.Equal(now, engines) {
		t.Fatalf("engines on gpu-a changed while serving: %v, then %v", engines, now)
	}
	if _, errOut, code := f.Server.CLI("delete", "deployment", "mid"); code != 0 {
		t.Fatalf("delete mid: exit %d: %s", code, errOut)
	}
	poll.Until(t, 30*time.Second, "no engine left on gpu-a", func() bool { return len(harness.EnginePIDs(a.StateDir)) == 0 })
}

// TestFleetFaults_DeployDeliveredLate cuts a host off (a partition that
// holds the bytes, delivered when it heals) just before a deploy the
// server sends it: the server gives the host up (lost, host_unreachable)
// and places the deployment on the other host, and the held request then
// reaches the first host when the partition heals (the partition counts
// the bytes it delivered late). Nothing may run twice: every deployment a
// host runs must be one the server places on it, and the deployment runs
// once, on the host that took it.
func TestFleetFaults_DeployDeliveredLate(t *testing.T) {
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	// Heartbeats every 2 s: the server gives a silent host up after three
	// missed (6 s), so the deploy sent right after the cut surely finds
	// gpu-b still ready and tries it first.
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=2s"}})
	f.Hosts["gpu-a"] = harness.StartHost(t, f.Server, harness.HostOptions{Name: "gpu-a"})
	token, cluster := f.Server.JoinToken("")
	proxy := harness.NewPartition(t, cluster)
	// gpu-b has the most free memory: the server tries it first.
	f.Hosts["gpu-b"] = harness.StartHostWith(t, proxy.Addr(), token, harness.HostOptions{Name: "gpu-b", GPU: harness.SimGPU{DeviceMemory: "80GiB"}})
	f.WaitHosts(2, wire.HostReady)
	f.Server.AddFakeEngine("fake")
	f.WaitEngine("fake")
	for _, h := range f.Hosts {
		h.WriteFile("models/late/README", "fake model\n")
	}
	dep := `{"name": "late", "engine": "fake", "model": {"path": "late"}}`
	proxy.Cut(false)
	if s := f.HostState("gpu-b"); s != wire.HostReady {
		t.Fatalf("gpu-b is %s right after the cut: the deploy would not try it", s)
	}
	a := f.MgmtDo(http.MethodPost, wire.Prefix+"/deployments", nil, `{"deployment": `+dep+`, "activate": true}`)
	if a.Err != nil || a.Status != http.StatusCreated {
		// The server must give the silent host up and place on the other:
		// a refusal leaves nothing to deliver late.
		t.Fatalf("deploy with gpu-b cut off: %v %d %s, want it placed on gpu-a\nserver:\n%s", a.Err, a.Status, a.Body, f.Server.Output())
	}
	if hs := hostsOf(f.Status("late")); !slices.Equal(hs, []string{"gpu-a"}) {
		t.Fatalf("late placed on %v with gpu-b cut off, want gpu-a", hs)
	}
	if s := f.HostState("gpu-b"); s == wire.HostReady {
		t.Fatalf("gpu-b is %s after the deploy gave it up", s)
	}
	if _, held := proxy.Late(); held != 0 {
		t.Fatalf("%d bytes delivered late before the heal", held)
	}
	proxy.Heal()
	// The late delivery: what the server sent gpu-b while cut off (the
	// deploy it gave up on) reaches gpu-b now.
	poll.Until(t, 30*time.Second, "the deploy held in the partition delivered to gpu-b", func() bool {
		_, late := proxy.Late()
		return late >= int64(len(dep)) // at least the deployment the request carries
	})
	_, late := proxy.Late()
	t.Logf("%d bytes the server sent during the partition reached gpu-b after it healed", late)
	poll.UntilSlow(t, 30*time.Second, "gpu-b back", func() bool { return f.HostState("gpu-b") == wire.HostReady })
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for {
		last = ""
		for hname, h := range f.Hosts {
			for _, d := range hostDeployments(t, h) {
				out, _, code := f.Server.CLI("status", "deployment", d.Name, "--json")
				var st wire.DeploymentStatus
				if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
					last += fmt.Sprintf("host %s runs %s (%s), which the server does not list; ", hname, d.Name, d.State)
				} else if !slices.Contains(hostsOf(st), hname) {
					last += fmt.Sprintf("host %s runs %s (%s), which the server places on %v only; ", hname, d.Name, d.State, hostsOf(st))
				}
			}
		}
		if last == "" && time.Now().After(deadline.Add(-15*time.Second)) || time.Now().After(deadline) {
			break // settled (given the late request a few seconds to land) or out of time
		}
		time.Sleep(300 * time.Millisecond)
	}
	if last != "" {
		t.Fatalf("after the partition healed: %s\nengines on gpu-a %v, on gpu-b %v", last,
			harness.EnginePIDs(f.Hosts["gpu-a"].StateDir), harness.EnginePIDs(f.Hosts["gpu-b"].StateDir))
	}
	if n := hostInstances(t, f.Hosts["gpu-a"], "late"); n != 1 {
		t.Fatalf("gpu-a runs %d instances of late, want 1", n)
	}
	if pids := harness.EnginePIDs(f.Hosts["gpu-b"].StateDir); len(pids) != 0 {
		t.Fatalf("engines run on gpu-b after the late delivery: %v", pids)
	}
	poll.UntilSlow(t, 30*time.Second, "late ready on gpu-a", func() bool { return f.Status("late").ReadyN == 1 })
	e2e.ChatOK(t, f.Server, "late")
}

// openStream sends a long streamed chat and returns once its first chunk
// arrived; the rest is read in the background into done (nil error: the
// stream ended, cleanly or cut; done says whether it finished: [DONE]
// without an error event; code is the error event's code, if one came).
type streamEnd struct {
	done bool
	code string
	err  error
}

func openStream(t *testing.T, r *harness.Role, model string, maxTokens int) <-chan streamEnd {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": "tell me a long story"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	resp, err := r.Chat(ctx, string(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %s", resp.StatusCode, harness.ReadAll(resp))
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before its first chunk: %v", err)
		}
		if strings.HasPrefix(line, "data: {") {
			break
		}
	}
	out := make(chan streamEnd, 1)
	go func() {
		defer resp.Body.Close()
		rest, err := io.ReadAll(br)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = nil // cut: the connection ended
		}
		end := streamEnd{err: err}
		if i := strings.Index(string(rest), `data: {"error":`); i >= 0 {
			var ev struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			line, _, _ := strings.Cut(string(rest[i+len("data: "):]), "\n")
			_ = json.Unmarshal([]byte(line), &ev)
			end.code = ev.Error.Code
		} else {
			end.done = strings.Contains(string(rest), "data: [DONE]")
		}
		out <- end
	}()
	return out
}

// hostInFlight reads a host's own load view: requests in flight for a
// deployment.
func hostInFlight(t *testing.T, h *harness.Role, name string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+h.Info.Management+wire.Prefix+"/metrics/load", nil)
	req.Header.Set("Authorization", "Bearer "+h.Creds.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	var load wire.LoadResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &load) != nil {
		t.Fatalf("host load view: %d %s", resp.StatusCode, body)
	}
	n := 0
	for _, d := range load.Deployments {
		if d.Deployment == name {
			n += d.Requests.InFlight + d.Requests.Waiting
		}
	}
	return n
}

// TestFleetFaults_ServerRestartWithOpenStreams stops the server (SIGTERM)
// while streams are open through it: every stream ends (the client sees
// the connection end, nothing hangs), the server exits, the hosts' routers
// let go of the relayed requests, and after a restart requests work again
// with the same engines.
func TestFleetFaults_ServerRestartWithOpenStreams(t *testing.T) {
	// 5 tokens a second for 1000 tokens: the streams outlive the drain.
	f := startFaultFleet(t, map[string]string{"gpu-a": "24GiB"}, []string{"--set", "shutdown.drain_timeout=1s"}, "--token-rate", "5")
	if out, errOut, code := f.Deploy("demo", harness.SimpleSpec("demo", "fake"), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}
	a := f.Hosts["gpu-a"]
	engines := harness.EnginePIDs(a.StateDir)
	var streams []<-chan streamEnd
	for i := 0; i < 4; i++ {
		streams = append(streams, openStream(t, f.Server, "demo", 1000))
	}
	poll.UntilSlow(t, 30*time.Second, "the host counts the four streams", func() bool { return hostInFlight(t, a, "demo") == 4 })

	stopped := make(chan struct{})
	go func() { f.Server.Stop(); close(stopped) }()
	ends := make([]*streamEnd, len(streams))
	poll.Until(t, 60*time.Second, "every stream through the stopping server ends", func() bool {
		all := true
		for i, s := range streams {
			if ends[i] == nil {
				select {
				case e := <-s:
					ends[i] = &e
				default:
					all = false
				}
			}
		}
		return all
	})
	for i, e := range ends {
		t.Logf("stream %d: finished %v, error event %q, error %v", i, e.done, e.code, e.err)
		if e.done {
			t.Errorf("stream %d finished its 1000 tokens within a 1 s drain: the stream was not the long one meant", i)
		}
		if e.code != "" && e.code != "shutting_down" {
			t.Errorf("stream %d ended with %s, want shutting_down (the server's drain timeout cut it) or a cut", i, e.code)
		}
	}
	select {
	case <-stopped:
	case <-time.After(90 * time.Second):
		t.Fatalf("the server did not exit\n%s", f.Server.Output())
	}
	// The host's router let go of the relayed requests (the engine's work
	// cancelled), while its engine kept running.
	poll.UntilSlow(t, 30*time.Second, "the host's in-flight count back to 0", func() bool { return hostInFlight(t, a, "demo") == 0 })

	f.Server.Restart()
	f.WaitHosts(1, wire.HostReady)
	e2e.ChatOK(t, f.Server, "demo")
	if st := f.Status("demo"); st.ReadyN != 1 || len(st.Instances) != 1 {
		t.Fatalf("demo after the server's restart: %+v", st)
	}
	if now := harness.EnginePIDs(a.StateDir); !slices.Equal(now, engines) {
		t.Fatalf("engines on gpu-a: %v before the server's restart, %v after", engines, now)
	}
}

// TestFleetFaults_LoadThroughHostCrash sends 200 requests, streamed and
// not, 8 at a time, at a deployment with a replica on each of two hosts,
// and kills one host agent (SIGKILL) during them, then restarts it. Every
// request ends (no hang); each one answers 200 in full, or 503
// host_unreachable with Retry-After, or is cut by the host's death (at most
// the requests in flight then); never a 500 or another code. The other
// replica keeps answering, and no engine restarts.
func TestFleetFaults_LoadThroughHostCrash(t *testing.T) {
	f := startFaultFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB"}, nil, "--token-rate", "40")
	if out, errOut, code := f.Deploy("demo", withInstancesLine(harness.SimpleSpec("demo", "fake"), 2), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}
	if hs := hostsOf(f.Status("demo")); len(hs) != 2 || hs[0] == hs[1] {
		t.Fatalf("demo on %v, want two hosts", hs)
	}
	engines := map[string][]int{}
	for name, h := range f.Hosts {
		engines[name] = harness.EnginePIDs(h.StateDir)
	}
	victim := f.Hosts["gpu-a"]

	const total, conc = 200, 8
	type outcome struct {
		kind  string // ok, unreachable, cut, bad
		phase int32
		what  string
	}
	var phase atomic.Int32 // 0 before the kill, 1 killed, 2 restarted
	var completed atomic.Int32
	results := make([]outcome, total)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				stream := i%2 == 1
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				resp, err := f.Server.Chat(ctx, harness.ChatBody("demo", stream, fmt.Sprintf("request %d", i)), nil)
				o := outcome{}
				switch {
				case err != nil:
					o = outcome{kind: "bad", what: err.Error()}
				default:
					b, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					body := string(b)
					switch {
					case ctx.Err() != nil:
						o = outcome{kind: "bad", what: "no answer within 60 s (hang)"}
					case resp.StatusCode == http.StatusOK && rerr == nil && (!stream || strings.Contains(body, "data: [DONE]")) &&
						(stream || strings.Contains(body, `"choices"`)):
						o = outcome{kind: "ok"}
					case resp.StatusCode == http.StatusOK:
						o = outcome{kind: "cut", what: fmt.Sprintf("stream %v, read error %v, %q", stream, rerr, body)}
					case resp.StatusCode == http.StatusServiceUnavailable && errorCode(body) == "host_unreachable" && resp.Header.Get("Retry-After") != "":
						o = outcome{kind: "unreachable"}
					default:
						o = outcome{kind: "bad", what: fmt.Sprintf("%d %v %s", resp.StatusCode, resp.Header, body)}
					}
				}
				cancel()
				o.phase = phase.Load()
				results[i] = o
				completed.Add(1)
			}
		}()
	}
	go func() {
		for i := 0; i < total; i++ {
			next <- i
		}
		close(next)
	}()
	poll.Until(t, 60*time.Second, "40 requests answered", func() bool { return completed.Load() >= 40 })
	phase.Store(1) // before the kill: a request cut in phase 0 is a bug
	victim.Kill9()
	poll.Until(t, 60*time.Second, "100 requests answered", func() bool { return completed.Load() >= 100 })
	victim.Restart()
	phase.Store(2)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(120 * time.Second):
		t.Fatalf("requests still unanswered after 120 s: %d of %d done", completed.Load(), total)
	}

	counts := map[string]int{}
	okWhileKilled := 0
	var bad []string
	for i, o := range results {
		counts[o.kind]++
		if o.kind == "ok" && o.phase == 1 {
			okWhileKilled++
		}
		if o.kind == "bad" {
			bad = append(bad, fmt.Sprintf("request %d (phase %d): %s", i, o.phase, o.what))
		}
		if o.kind == "cut" {
			t.Logf("request %d (phase %d) cut: %s", i, o.phase, o.what)
			if o.phase == 0 {
				t.Errorf("request %d was cut before any host died: %s", i, o.what)
			}
		}
	}
	t.Logf("outcomes: %v; ok while gpu-a was dead: %d", counts, okWhileKilled)
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%d requests answered neither in full nor with a coded 503 nor cut:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if counts["cut"] > conc {
		t.Errorf("%d requests cut, more than the %d that could be in flight when gpu-a died", counts["cut"], conc)
	}
	if okWhileKilled == 0 {
		t.Errorf("no request answered while gpu-a was dead: the replica on gpu-b did not take over")
	}

	f.WaitHosts(2, wire.HostReady)
	poll.UntilSlow(t, 30*time.Second, "demo ready on both hosts", func() bool { return f.Status("demo").ReadyN == 2 })
	for i := 0; i < 4; i++ {
		e2e.ChatOK(t, f.Server, "demo")
	}
	for name, h := range f.Hosts {
		if now := harness.EnginePIDs(h.StateDir); !slices.Equal(now, engines[name]) {
			t.Errorf("engines on %s: %v before, %v after: restarted or started twice", name, engines[name], now)
		}
	}
}
