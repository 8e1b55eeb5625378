// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// The attack rows of make faults: each runs a server with one honest host
// ("gpu-a", serving "demo" under steady traffic through the server) and
// attacks the server's trust boundaries as a network peer, a local user or
// a compromised host (plugins-testkit/attack). A row says what the attack
// did and whether the server stayed within its bounds (resident memory,
// database size) and kept serving the honest host's traffic; it fails
// otherwise. The trust model they test is in the several-machines guide.
//
// A compromised host's attacks on the state it reports (events, journals,
// inventory, routes: H3, M2, M3 of the trust review) are in
// attacks_host.go.

// AttackScale sizes the attack rows.
type AttackScale struct {
	// Streams, Rate, TokenRate and StreamTokens shape the traffic to the
	// honest host, as Scale does.
	Streams, Rate, TokenRate, StreamTokens int
	// Baseline and Settle are traffic windows before and after.
	Baseline, Settle time.Duration
	// Recover bounds each wait for the server and hosts.
	Recover time.Duration
	// Hold is how long a lasting attack (a flood) is held under traffic.
	Hold time.Duration
	// FloodOne connections come from one address and FloodPerSource from
	// each of FloodSources others (the cluster flood).
	FloodOne, FloodSources, FloodPerSource int
	// LocalIdle idle connections from 127.0.0.1 (and half as many from
	// other loopback addresses) and LocalBegun that sent a byte flood the
	// management listener.
	LocalIdle, LocalBegun int
	// BigClients send BigBodies bodies of 64 MiB each through the server.
	BigClients, BigBodies int
	// MaxRSSGrowth and MaxDBGrowth are the bounds a row holds the server
	// to: its resident memory's peak over its start, its database's growth.
	// Three times limits.max_body_bytes_in_flight (256 MiB): the bound
	// counts the bodies alive, not the garbage Go's collector has not
	// returned yet (a standalone role peaks near 0.7 GiB under the same
	// flood, see operations/faults.md).
	MaxRSSGrowth, MaxDBGrowth int64
}

// AttacksFull is the scale of make faults.
var AttacksFull = AttackScale{
	Streams: 20, Rate: 10, TokenRate: 5, StreamTokens: 50,
	Baseline: 2 * time.Second, Settle: 2 * time.Second, Recover: 60 * time.Second, Hold: 8 * time.Second,
	FloodOne: 300, FloodSources: 80, FloodPerSource: 5, LocalIdle: 600, LocalBegun: 600,
	BigClients: 12, BigBodies: 2, MaxRSSGrowth: 768 << 20, MaxDBGrowth: 8 << 20,
}

// AttacksQuick is the scale of make test.
var AttacksQuick = AttackScale{
	Streams: 4, Rate: 4, TokenRate: 5, StreamTokens: 20,
	Baseline: time.Second, Settle: time.Second, Recover: 60 * time.Second, Hold: time.Second,
	FloodOne: 60, FloodSources: 10, FloodPerSource: 3, LocalIdle: 520, LocalBegun: 100,
	BigClients: 2, BigBodies: 1, MaxRSSGrowth: 768 << 20, MaxDBGrowth: 8 << 20,
}

// Attack is one attack row.
type Attack struct {
	// Name is the row's first cell; Finding the trust review's finding it
	// reproduces (H1, M5...).
	Name, Finding string
	// Inject runs the attack; it returns when the attack is over (a flood
	// closed), noting what it did and adding a problem for every bound
	// the server did not hold.
	Inject func(e *AttackEnv)
}

// AttackEnv is what an attack works with.
type AttackEnv struct {
	T       testing.TB
	Server  *harness.Role
	Honest  *harness.Role
	Traffic *Traffic
	Scale   AttackScale

	notes    []string
	problems []string
}

// Note adds to the row's account of what the attack did.
func (e *AttackEnv) Note(format string, args ...any) {
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// Problem records a bound the server did not hold: the row fails.
func (e *AttackEnv) Problem(format string, args ...any) {
	e.problems = append(e.problems, fmt.Sprintf(format, args...))
}

// CLI runs a capyctl command against the server with a deadline and
// returns its output, exit code (-1 when the deadline killed it) and how
// long it took.
func (e *AttackEnv) CLI(timeout time.Duration, args ...string) (string, int, time.Duration) {
	env := &Env{T: e.T, Role: e.Server}
	return env.CLI(timeout, args...)
}

// AttackRow is one attack's line of the table.
type AttackRow struct {
	Attack, Finding string
	// Did is what the attack did and what the server answered.
	Did string
	// Failed are the honest host's requests that failed during the
	// attack.
	Failed string
	// Memory is the server's resident memory: before, peak, after.
	Memory string
	// Database is the server's database size before and after.
	Database string
	// Problems are the bounds the server did not hold.
	Problems []string
}

// Attacks are the attack rows of make faults, in the order they run.
func Attacks() []Attack {
	return []Attack{ClusterFlood(), ManagementFlood(), ServerBigBodies(), CompromisedHostRelay(), RemovedHostStolenCertificate(),
		CompromisedHostFlood(), CompromisedHostLies(), LostHostRemoved()}
}

// attackSpec is a deployment on the fake engine placed on one host.
func attackSpec(name, host string) string {
	return fmt.Sprintf(`deployment %q {
  engine = %q
  placement {
    hosts = [%q]
  }
  model {
    path = %q
  }
  engine_config {
    max_concurrent_requests = 256
  }
  resources {
    gpu = "4GiB"
    ram = "256MiB"
  }
}
`, name, engineName, host, name)
}

// addEngine registers the fake engine through r: on a server, on every
// host joined then; on a host, on that host.
func addEngine(r *harness.Role, s AttackScale) {
	r.AddFakeEngine(engineName, "--token-rate", fmt.Sprint(s.TokenRate), "--tokens", "100000",
		"--max-running", "512", "--sim-weights", "2GiB")
}

// deployOn deploys name on host through the server and waits until it is
// ready.
func deployOn(t testing.TB, server, host *harness.Role, name, hostName string) {
	t.Helper()
	host.WriteFile("models/"+name+"/README", "fake model\n")
	if out, errOut, code := server.Deploy(name, attackSpec(name, hostName), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy %s on %s: exit %d\n%s%s\nserver:\n%s", name, hostName, code, out, errOut, server.Output())
	}
}

// hostReady waits until the server lists host ready (link and relay up)
// and says whether it did within bound.
func hostReady(server *harness.Role, name string, bound time.Duration) bool {
	return waitUntil(bound, func() bool {
		out, _, code := server.CLI("list", "hosts", "--json")
		if code != 0 {
			return false
		}
		var hosts []wire.Host
		if json.Unmarshal([]byte(out), &hosts) != nil {
			return false
		}
		for _, h := range hosts {
			if h.Name == name && h.State == wire.HostReady {
				return true
			}
		}
		return false
	})
}

// dbSize is the size of a role's database file.
func dbSize(stateDir string) int64 {
	fi, err := os.Stat(filepath.Join(stateDir, "capyctl.db"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// failedCount counts the outcomes that are not "ok".
func failedCount(o Outcomes) int {
	n := 0
	for _, m := range []map[string]int{o.Requests, o.Streams} {
		for k, v := range m {
			if k != "ok" {
				n += v
			}
		}
	}
	return n
}

// RunAttack starts a server and the honest host, puts traffic on it
// through the server, runs the attack and measures the row.
func RunAttack(t testing.TB, a Attack, s AttackScale) AttackRow {
	row := AttackRow{Attack: a.Name, Finding: a.Finding}
	server := harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	honest := harness.StartHost(t, server, harness.HostOptions{Name: "gpu-a"})
	if !hostReady(server, "gpu-a", s.Recover) {
		t.Fatalf("gpu-a not ready\n%s", server.Output())
	}
	addEngine(server, s)
	deployOn(t, server, honest, trafficDep, "gpu-a")

	tokensFor := time.Duration(s.StreamTokens/max(s.TokenRate, 1)) * time.Second
	traffic := StartTraffic(TrafficConfig{
		Model: trafficDep, Streams: s.Streams, StreamTokens: s.StreamTokens,
		StreamDeadline: tokensFor + 30*time.Second, Rate: s.Rate, RequestDeadline: 10 * time.Second,
		Lifetime: 8 * time.Minute,
	}, server.InferenceURL(), server.Creds.APIKey)
	defer traffic.Stop()
	harness.Eventually(t, 60*time.Second, fmt.Sprintf("%d streams open through the server", s.Streams), func() bool {
		return traffic.Open() >= s.Streams
	})
	// The baseline is a window of traffic, not a wait for a condition.
	time.Sleep(s.Baseline)
	pid := server.PID()
	rssBefore, dbBefore := rss(pid, "VmRSS"), dbSize(server.StateDir)
	base := traffic.Outcomes()
	e := &AttackEnv{T: t, Server: server, Honest: honest, Traffic: traffic, Scale: s}
	a.Inject(e)

	ended := time.Now()
	if !waitUntil(s.Recover, func() bool { _, ok := traffic.ServedAfter(ended); return ok }) {
		e.Problem("the honest host's model was not served again within %s", s.Recover)
	}
	// The settle window is traffic after the attack, not a wait.
	time.Sleep(s.Settle)
	open := traffic.Open()
	traffic.Stop()
	out := traffic.Outcomes().Sub(base)
	row.Failed = fmt.Sprintf("%s; %d streams open at the end", out.Failed(), open)
	if n := failedCount(out); n > 0 {
		e.Problem("%d of the honest host's requests failed", n)
	}
	peak, after, dbAfter := rss(pid, "VmHWM"), rss(pid, "VmRSS"), dbSize(server.StateDir)
	row.Memory = fmt.Sprintf("%d → %d (peak) → %d MiB", rssBefore>>20, peak>>20, after>>20)
	row.Database = fmt.Sprintf("%d → %d KiB", dbBefore>>10, dbAfter>>10)
	if peak-rssBefore > s.MaxRSSGrowth {
		e.Problem("the server's resident memory peaked %d MiB over its start (bound %d MiB)", (peak-rssBefore)>>20, s.MaxRSSGrowth>>20)
	}
	if dbAfter-dbBefore > s.MaxDBGrowth {
		e.Problem("the server's database grew %d KiB (bound %d KiB)", (dbAfter-dbBefore)>>10, s.MaxDBGrowth>>10)
	}
	row.Did = strings.Join(e.notes, "; ")
	row.Problems = e.problems
	return row
}

// AttackMarkdown renders attack rows as a table.
func AttackMarkdown(rows []AttackRow) string {
	var b strings.Builder
	b.WriteString("| attack (finding) | what it did, and what the server answered | the honest host's requests failed | server resident memory (before → peak → after) | server database | bounds held |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }
	for _, r := range rows {
		held := "yes"
		if len(r.Problems) > 0 {
			held = "no: " + strings.Join(r.Problems, "; ")
		}
		fmt.Fprintf(&b, "| %s (%s) | %s | %s | %s | %s | %s |\n", cell(r.Attack), cell(r.Finding), cell(r.Did), cell(r.Failed),
			cell(r.Memory), cell(r.Database), cell(held))
	}
	return b.String()
}

// ClusterFlood (H1) holds hundreds of idle TCP connections to the cluster
// listener, from one address and from many, while a new host joins and
// links through it and links again after a restart.
func ClusterFlood() Attack {
	return Attack{Name: "idle flood of the cluster listener", Finding: "H1", Inject: func(e *AttackEnv) {
		s := e.Scale
		one := attack.OpenFlood(attack.FloodOptions{Target: e.Server.ClusterAddr, PerSource: s.FloodOne, Sources: attack.Loopback(2, 1)})
		defer one.Close()
		many := attack.OpenFlood(attack.FloodOptions{Target: e.Server.ClusterAddr, PerSource: s.FloodPerSource, Sources: attack.Loopback(10, s.FloodSources)})
		defer many.Close()
		e.Note("%d idle connections from one address and %d from %d others (%d more refused while connecting)",
			one.Opened(), many.Opened(), s.FloodSources, s.FloodOne-one.Opened()+s.FloodSources*s.FloodPerSource-many.Opened())
		start := time.Now()
		joined := harness.StartHost(e.T, e.Server, harness.HostOptions{Name: "gpu-b"})
		if !hostReady(e.Server, "gpu-b", s.Recover) {
			e.Problem("a new host did not join and link within %s", s.Recover)
			return
		}
		e.Note("a new host joined and linked in %.1f s", time.Since(start).Seconds())
		start = time.Now()
		joined.Stop()
		joined.Restart()
		if !hostReady(e.Server, "gpu-b", s.Recover) {
			e.Problem("the new host did not link again after a restart within %s", s.Recover)
			return
		}
		e.Note("it linked again after a restart in %.1f s", time.Since(start).Seconds())
		// The flood lasts a window of traffic.
		time.Sleep(s.Hold)
		e.Note("%d of the flood's connections closed by the server after %s (handshake deadline)",
			one.ClosedByPeer()+many.ClosedByPeer(), s.Hold)
	}}
}

// ManagementFlood (M5) plays another local user: idle connections to the
// server's management port from 127.0.0.1 (the CLI's and the browser's
// address) and from other loopback addresses, then connections that each
// sent a byte; the CLI and the dashboard must keep answering.
func ManagementFlood() Attack {
	return Attack{Name: "local user's connection flood of the management listener", Finding: "M5", Inject: func(e *AttackEnv) {
		s := e.Scale
		mgmt := e.Server.Info.Management
		idle := attack.OpenFlood(attack.FloodOptions{Target: mgmt, PerSource: s.LocalIdle})
		defer idle.Close()
		others := attack.OpenFlood(attack.FloodOptions{Target: mgmt, PerSource: s.LocalIdle / 20, Sources: attack.Loopback(2, 10)})
		defer others.Close()
		e.Note("%d idle connections from 127.0.0.1, %d from 10 other loopback addresses", idle.Opened(), others.Opened())
		out, code, took := e.CLI(30*time.Second, "status")
		e.Note("capyctl status: exit %d in %.1f s", code, took.Seconds())
		if code != 0 {
			e.Problem("capyctl status under the idle flood: exit %d: %s", code, firstLine(out))
		}
		if why := DashboardLogin(mgmt, e.Server.Creds.AdminToken); why != "" {
			e.Problem("the dashboard under the idle flood: %s", why)
		} else {
			e.Note("the dashboard logged in")
		}
		begun := attack.OpenFlood(attack.FloodOptions{Target: mgmt, PerSource: s.LocalBegun, Send: []byte("G")})
		defer begun.Close()
		out, code, took = e.CLI(30*time.Second, "list", "hosts")
		e.Note("%d connections that each sent a byte: capyctl list hosts: exit %d in %.1f s", begun.Opened(), code, took.Seconds())
		if code != 0 {
			e.Problem("capyctl list hosts under a flood of begun requests: exit %d: %s", code, firstLine(out))
		}
		time.Sleep(s.Hold)
	}}
}

// DashboardLogin logs in to the dashboard at mgmt over fresh connections
// and reads the session back; it returns what failed, "" when it worked.
func DashboardLogin(mgmt, token string) string {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	base := "http://" + mgmt
	do := func(method, path, body string) string {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Origin", base)
		}
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := hc.Do(req)
		if err != nil {
			return method + " " + path + ": " + attack.ShortErr(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return method + " " + path + ": " + resp.Status
		}
		return ""
	}
	for _, step := range [][3]string{{http.MethodGet, "/dashboard/", ""}, {http.MethodPost, "/dashboard/login", `{"token":"` + token + `"}`},
		{http.MethodGet, "/dashboard/session", ""}} {
		if why := do(step[0], step[1], step[2]); why != "" {
			return why
		}
	}
	return ""
}

// ServerBigBodies (M1) sends BigClients×BigBodies chat bodies of 64 MiB
// through the server at once: it holds no more of them than
// limits.max_body_bytes_in_flight and refuses the rest 429.
func ServerBigBodies() Attack {
	return Attack{Name: "flood of 64 MiB bodies through the server", Finding: "M1", Inject: func(e *AttackEnv) {
		s := e.Scale
		body := bigBody(trafficDep, 64<<20)
		var mu sync.Mutex
		results := map[string]int{}
		var wg sync.WaitGroup
		tr := &http.Transport{MaxIdleConnsPerHost: s.BigClients}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		for i := 0; i < s.BigClients; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < s.BigBodies; j++ {
					res := sendBig(hc, e.Server.InferenceURL(), e.Server.Creds.APIKey, body)
					mu.Lock()
					results[res]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		// The fake engine refuses bodies over 32 MiB (400 engine_rejected);
		// a client that is still sending when the server refuses its body
		// unread may see the connection reset rather than the 429.
		e.Note("%d bodies of 64 MiB: %s", s.BigClients*s.BigBodies, countsList(results))
	}}
}

// CompromisedHostRelay plays a compromised host (L3, L1): a second host's
// stolen key and certificate drive its host link and its relay after its
// agent stopped, and answer the requests the server sends for the model
// placed on it with a cookie, CORS headers and a header of their own. The
// client must see none of them; a request that names one model and
// another in other letters must be refused by the server, never placed.
func CompromisedHostRelay() Attack {
	return Attack{Name: "compromised host answers its relay with cookies, CORS and its own headers; a client smuggles a second model", Finding: "L3, L1",
		Inject: func(e *AttackEnv) {
			s := e.Scale
			victim := harness.StartHost(e.T, e.Server, harness.HostOptions{Name: "gpu-b"})
			if !hostReady(e.Server, "gpu-b", s.Recover) {
				e.T.Fatalf("gpu-b not ready")
			}
			// It joined after the engine was registered on the server: the
			// registration is desired state, pushed to it on its link.
			poll.Until(e.T, s.Recover, "gpu-b gets the engine the server registered", func() bool {
				out, _, code := victim.CLI("engine", "list", "--json")
				return code == 0 && strings.Contains(out, `"`+engineName+`"`)
			})
			deployOn(e.T, e.Server, victim, "victim", "gpu-b")
			id, err := attack.StealHostIdentity(victim.StateDir)
			if err != nil {
				e.T.Fatalf("steal gpu-b's identity: %v", err)
			}
			victim.Stop()
			bad := &attack.CompromisedHost{ID: id, Server: e.Server.ClusterAddr}
			ctx, cancel := context.WithTimeout(context.Background(), s.Recover)
			defer cancel()
			// It says hello as gpu-b would: the instance it ran, ready. A
			// host that journals nothing for a deployment is still making
			// its share, and gets none of its requests.
			hello := &hostv1.Hello{HostName: id.Name, Protocol: 1, Inventory: &hostv1.Inventory{},
				Instances: []*hostv1.InstanceJournal{{InstanceId: "victim/0", Generation: 1, Deployment: "victim", State: "ready",
					SinceUnixMs: time.Now().UnixMilli()}}}
			var link *attack.Link
			if !waitUntil(s.Recover, func() bool {
				link, err = bad.Link(ctx, hello)
				return err == nil
			}) {
				e.T.Fatalf("the stolen identity's link: %v", err)
			}
			defer link.Close()
			link.Beat(300*time.Millisecond, []*hostv1.LedgerReading{{Domain: "gpu0", CapacityBytes: 24 << 30}})
			var reached atomic.Int64
			stop, err := bad.ServeRelay(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				h := w.Header()
				h.Set("Set-Cookie", "capyctl_session=stolen; Path=/; HttpOnly")
				h.Set("Access-Control-Allow-Origin", "*")
				h.Set("Access-Control-Allow-Credentials", "true")
				h.Set("X-Compromised", "1")
				h.Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[]}`)
			}))
			if err != nil {
				e.T.Fatalf("the stolen identity's relay: %v", err)
			}
			defer stop()
			if !hostReady(e.Server, "gpu-b", s.Recover) {
				e.Problem("the stolen identity's link and relay were not taken (a revoked or unknown host?)")
				return
			}
			e.Note("gpu-b's agent stopped; its stolen certificate linked and served the relay")
			leaked := map[string]int{}
			answered := 0
			for i := 0; i < 10; i++ {
				resp, err := post(e, `{"model":"victim","messages":[]}`)
				if err != nil {
					continue
				}
				answered++
				for _, k := range []string{"Set-Cookie", "Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "X-Compromised"} {
					if resp.Header.Get(k) != "" {
						leaked[k]++
					}
				}
			}
			e.Note("10 requests for its model: %d answered by the compromised relay, headers it set that reached the client: %s", reached.Load(), orNone(leaked))
			if reached.Load() == 0 || answered == 0 {
				e.Problem("no request reached the compromised relay: the attack did not run")
			}
			if len(leaked) > 0 {
				e.Problem("the host's headers reached the client: %s", countsList(leaked))
			}
			resp, err := post(e, `{"model":"victim","Model":"`+trafficDep+`"}`)
			switch {
			case err != nil:
				e.Problem("a body naming two models: %v", err)
			case resp.StatusCode != http.StatusBadRequest:
				e.Problem("a body naming two models: %d, want 400 invalid_request", resp.StatusCode)
			default:
				e.Note("a body naming \"victim\" and \"Model\":\"demo\" refused 400")
			}
		}}
}

// post sends one chat body to the server and returns the answer, read.
func post(e *AttackEnv, body string) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.Server.InferenceURL()+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.Server.Creds.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

func orNone(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	return countsList(m)
}
