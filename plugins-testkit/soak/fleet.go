// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// The fleet profile runs a server and two hosts, each a capyctl process
// on loopback, and drives them through their black-box surfaces only: the
// CLI, the management API (the server's for every operation, each host's
// own for what it holds) and the server's inference API, since the
// fleet's insides are being reshaped. Besides the standalone operations it
// kills a host agent and the server with SIGKILL and starts them again.

// Fleet is the fleet profile.
var Fleet = Profile{Name: "fleet", Ops: 300, QuietEvery: 25, Table: true, RoleKill: 10}

// fleetHosts are the fleet's hosts: one 24 GiB card each.
var fleetHosts = []string{"fleet-a", "fleet-b"}

// fleetParts are the server's hosts and what their quiet points measured.
type fleetParts struct {
	hosts map[string]*harness.Role
	names []string
	quiet map[string]*quietState
	// server is the server's resident memory and open files (read from
	// /proc: a server routes no request and has no /metrics).
	server quietState
	// lives are each host's output of its earlier lives (a kill -9 and
	// restart starts a new one), for the failure report.
	lives map[string][]string
}

// fleetPool are the deployments of the fleet profile: the fake engine
// (custom) in models that do not all fit, one spread over both hosts, and
// a vLLM model that parks.
func fleetPool() []depSpec {
	fake := func(name, gpu string, instances int, idle bool) depSpec {
		return depSpec{name: name, engine: "fake", family: "custom", body: func(v int) string {
			return fmt.Sprintf(`  engine    = "fake"
  instances = %d
  model {
    path = %q
  }
  resources {
    gpu = %q
    ram = "256MiB"
  }
  engine_config {
    max_concurrent_requests = %d
  }
%s`, instances, name, gpu, 16-v%3, common(v, idle))
		}}
	}
	return []depSpec{
		fake("fl-a", "8GiB", 1, false),
		fake("fl-b", "8GiB", 1, true),
		fake("fl-c", "10GiB", 1, false),
		fake("fl-spread", "6GiB", 2, false),
		{name: "fl-vllm", engine: "vllm", family: "vllm", parks: true, body: func(v int) string {
			return fmt.Sprintf(`  engine    = "vllm"
  residency = "deep"
  lmcache   = "off"
  model {
    path = "fl-vllm/model"
  }
  engine_config {
    max_concurrent_requests = %d
    memory {
      request = "7GiB"
      startup = "7GiB"
    }
  }
%s`, 16-v%3, common(v, false))
		}},
	}
}

// RunFleet runs the fleet profile.
func RunFleet(t testing.TB, p Profile, seed uint64) {
	r := &Runner{t: t, profile: p, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		deps: map[string]*depState{}, stats: map[string]*opStats{}}
	r.say("soak: seed %d, profile %s (reproduce with %s=%d %s=%s)", seed, p.Name, EnvSeed, seed, EnvProfile, p.Name)
	r.role = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	r.roleLives = 1
	f := &fleetParts{hosts: map[string]*harness.Role{}, quiet: map[string]*quietState{}, server: newQuietState(), lives: map[string][]string{}}
	r.fleet = f
	for _, name := range fleetHosts {
		f.hosts[name] = harness.StartHost(t, r.role, harness.HostOptions{Name: name,
			GPU: harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "6GiB", SystemReserve: "512MiB"}})
		f.names = append(f.names, name)
		q := newQuietState()
		f.quiet[name] = &q
	}
	if !f.waitHosts(r, 60*time.Second) {
		r.fail("setup", "the hosts did not join")
	}
	// Engines are registered through the server, which hands them to its
	// hosts; model directories are written on every host.
	r.role.AddFakeEngine("fake", "--token-rate", "400", "--sim-weights", "3GiB", "--sim-kv", "512MiB")
	venv := conformance.FakeVenv(t, filepath.Join(r.role.StateDir, "engines", "vllm"), map[string]string{"vllm": "0.32.0"}, nil)
	if out, errOut, code := r.role.CLI("engine", "add", venv, "--yes", "--name", "vllm",
		"--env", "CAPYCTL_FAKE_SIM_WEIGHTS=3GiB", "--env", "CAPYCTL_FAKE_TOKEN_RATE=400"); code != 0 {
		r.fail("setup", fmt.Sprintf("engine add vllm: exit %d\n%s%s", code, out, errOut))
	}
	for _, h := range f.hosts {
		for _, d := range fleetPool() {
			if d.engine == "fake" {
				h.WriteFile("models/"+d.name+"/README", "fake model\n")
			}
		}
		conformance.FakeModel(t, filepath.Join(h.StateDir, "models", "fl-vllm"), 4<<20)
	}
	if !waitFor(30*time.Second, func() bool { return f.hostsList(r, "fake") && f.hostsList(r, "vllm") }) {
		r.fail("setup", "the hosts do not list the engines registered through the server")
	}
	r.codes = catalogue(t, r.role)
	for _, d := range fleetPool() {
		r.deps[d.name] = &depState{spec: d}
		r.names = append(r.names, d.name)
	}
	sort.Strings(r.names)
	r.reqs = newRequests(func() (string, string) { return r.role.InferenceURL(), r.role.Creds.APIKey }, r.codes)
	defer r.reqs.close()
	r.start = time.Now()
	r.quiet = newQuietState()
	r.loop()
	table := r.table()
	r.say("\n%s", table)
	if path := os.Getenv(EnvTable); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Errorf("write %s: %v", path, err)
		}
	}
	r.say("soak: %d operations, seed %d, %s, nothing leaked", r.ops, seed, p.Name)
}

// hostList is the server's list of hosts.
func (f *fleetParts) hostList(r *Runner) []wire.Host {
	ctx, cancel := ctxFor(20 * time.Second)
	defer cancel()
	hosts, err := r.role.Mgmt.Hosts(ctx)
	if err != nil {
		return nil
	}
	return hosts
}

// waitHosts waits until the server has every host ready.
func (f *fleetParts) waitHosts(r *Runner, bound time.Duration) bool {
	return waitFor(bound, func() bool {
		ready := 0
		for _, h := range f.hostList(r) {
			if h.State == wire.HostReady {
				ready++
			}
		}
		return ready == len(f.names)
	})
}

// hostsList reports whether every host lists an engine.
func (f *fleetParts) hostsList(r *Runner, engine string) bool {
	hosts := f.hostList(r)
	if len(hosts) != len(f.names) {
		return false
	}
	for _, h := range hosts {
		found := false
		for _, e := range h.Engines {
			found = found || e == engine
		}
		if !found {
			return false
		}
	}
	return true
}

// opKillHost kills a host agent with SIGKILL and starts it again: its
// engines run on and are re-attached, and the server has it ready again.
func (r *Runner) opKillHost() (string, string) {
	f := r.fleet
	name := f.names[r.rng.IntN(len(f.names))]
	h := f.hosts[name]
	h.Kill9()
	f.lives[name] = append(f.lives[name], h.Output())
	f.quiet[name].newLife()
	h.Restart()
	what := "kill -9 host agent " + name + ", restarted"
	if !f.waitHosts(r, 60*time.Second) {
		r.fail(what, "the server does not have every host ready within 60 s of the restart")
	}
	return what, "ok"
}

// killServer kills the server with SIGKILL and starts it again on its
// state directory; the hosts reconnect by themselves.
func (r *Runner) killServer() (string, string) {
	f := r.fleet
	r.reqs.roleKilled()
	r.role.Kill9()
	r.lives = append(r.lives, r.role.Output())
	r.role.Restart()
	r.roleLives++
	f.server.newLife()
	what := fmt.Sprintf("kill -9 server, restarted (life %d)", r.roleLives)
	if !f.waitHosts(r, 60*time.Second) {
		r.fail(what, "the hosts did not reconnect within 60 s of the server's restart")
	}
	return what, "ok"
}

// killFleetDriver kills a driver process on a host.
func (r *Runner) killFleetDriver() (string, string) {
	f := r.fleet
	type cand struct {
		host, family string
		pids         []int
	}
	var cands []cand
	for _, name := range f.names {
		for _, fam := range families {
			if p := harness.DriverPIDs(f.hosts[name].StateDir, fam); len(p) > 0 {
				cands = append(cands, cand{name, fam, p})
			}
		}
	}
	if len(cands) == 0 {
		return "kill -9 driver", "skipped: no driver runs"
	}
	c := cands[r.rng.IntN(len(cands))]
	for _, pid := range c.pids {
		_ = killPID(pid)
	}
	return fmt.Sprintf("kill -9 driver %s on %s %v", c.family, c.host, c.pids), "ok"
}

// quietPoint checks each host against the baseline of its state through
// its own management API and the process table, and the server's own
// processes: none of the role's engines or drivers runs under the server.
func (f *fleetParts) quietPoint(r *Runner) {
	for _, name := range f.names {
		h := f.hosts[name]
		var problems []string
		var reading quietReading
		q := f.quiet[name]
		ok := waitFor(30*time.Second, func() bool {
			reading, problems = readRole(h, nil, q.baselines)
			return len(problems) == 0
		})
		if !ok {
			r.fail("quiet point", "leaked on host "+name+": "+strings.Join(problems, "; "))
		}
		q.record(reading)
	}
	var bad []string
	if p := harness.EnginePIDs(r.role.StateDir); len(p) > 0 {
		bad = append(bad, fmt.Sprintf("processes run in the server's state directory: %v", p))
	}
	for _, fam := range families {
		if p := harness.DriverPIDs(r.role.StateDir, fam); len(p) > 0 {
			bad = append(bad, fmt.Sprintf("%s driver processes run under the server: %v", fam, p))
		}
	}
	if len(bad) > 0 {
		r.fail("quiet point", "leaked on the server: "+strings.Join(bad, "; "))
	}
	rss, fds := procFigures(r.role.PID())
	f.server.record(quietReading{signature: "server", rss: rss, fds: fds})
	if b := f.server.baselines["server"]; b != nil && fds > b.fds+float64(Tolerances.OpenFiles) {
		r.fail("quiet point", fmt.Sprintf("leaked on the server: %v open files, %v at its baseline (tolerance %d)", fds, b.fds, Tolerances.OpenFiles))
	}
}

// rssGrowth names a growth of a fleet role's memory, or returns "".
func (f *fleetParts) rssGrowth() string {
	if g := f.server.rssGrowth(); g != "" {
		return "the server: " + g
	}
	for _, name := range f.names {
		if g := f.quiet[name].rssGrowth(); g != "" {
			return "host " + name + ": " + g
		}
	}
	return ""
}

// procFigures reads a process's resident memory (bytes) and open files
// from /proc.
func procFigures(pid int) (rss, fds float64) {
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				rss = kb * 1024
			}
		}
	}
	if entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err == nil {
		fds = float64(len(entries))
	}
	return rss, fds
}

// report writes each host's goroutines and whole output, every life, to
// f for a failure: a host that hangs says what it waits for (SIGQUIT), as
// the server does.
func (f *fleetParts) report(out *os.File) {
	for _, name := range f.names {
		h := f.hosts[name]
		if !h.QuitWithStacks(15 * time.Second) {
			fmt.Fprintf(out, "==== host %s did not exit on SIGQUIT within 15 s (killed): no goroutine dump ====\n", name)
		}
		for i, l := range append(f.lives[name], h.Output()) {
			fmt.Fprintf(out, "==== host %s, life %d ====\n%s\n", name, i+1, l)
		}
	}
}

// moving names an instance in a transitional state as its own host knows
// it ("" when none; an unreadable host is left to the quiet point's own
// reading).
func (f *fleetParts) moving() string {
	for _, name := range f.names {
		ctx, cancel := ctxFor(20 * time.Second)
		snap, err := f.hosts[name].Mgmt.Snapshot(ctx)
		cancel()
		if err != nil {
			continue
		}
		if m := movingIn(snap, name); m != "" {
			return m
		}
	}
	return ""
}
