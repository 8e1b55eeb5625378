// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// transitionBounds are how long an instance may stay in each transitional
// state, from the pool's timeouts: a start's readiness (initialize 30 s),
// a wake (30 s), a stop (20 s grace) and a drain (the role's 30 s drain
// timeout), each with a margin for a loaded machine; a park may take the
// driver's 2 minutes, a re-attach after a role restart its minute and a
// readiness probe of 2 minutes.
var transitionBounds = map[string]time.Duration{
	"starting":    60 * time.Second,
	"waking":      60 * time.Second,
	"stopping":    60 * time.Second,
	"draining":    45 * time.Second,
	"parking":     150 * time.Second,
	"reconciling": 200 * time.Second,
	// A fleet's instance on a host the server lost: the fleet profile
	// restarts a killed host at once.
	"uncertain": 90 * time.Second,
}

// Tolerances are how far a quiet point's readings may be above the
// baseline of the same state (the lowest reading of that state so far):
// goroutines and open files of the role, which idle connections and
// timers move a little; and how much the role's resident memory may grow
// over one life of the role (from the highest reading of its first half to
// the lowest of its last quarter).
var Tolerances = struct {
	Goroutines, OpenFiles int
	RSSBytes              float64
	RSSRatio              float64
}{Goroutines: 40, OpenFiles: 40, RSSBytes: 48 << 20, RSSRatio: 0.20}

// holdsProcesses reports whether an instance in this state may own
// processes (and so a ledger charge).
func holdsProcesses(state string) bool {
	switch state {
	case "stopped", "failed", "":
		return false
	}
	return true
}

// checkAlways checks what must hold after every operation.
func (r *Runner) checkAlways(after string) {
	if broken := r.reqs.broken.take(); len(broken) > 0 {
		r.fail(after, "a request ended without an answer or a coded refusal within its bound: "+strings.Join(broken, "; "))
	}
	snap, err := r.snapshot()
	if err != nil {
		r.fail(after, "the role's snapshot: "+err.Error())
	}
	now := time.Now()
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			if b, ok := transitionBounds[in.State]; ok && now.Sub(in.Since) > b {
				r.fail(after, fmt.Sprintf("instance %s has been %s since %s, past its bound of %s", in.ID, in.State, in.Since.Format(time.RFC3339Nano), b))
			}
		}
	}
	if bad := ledgerLimits(snap); len(bad) > 0 {
		r.fail(after, "ledger: "+strings.Join(bad, "; "))
	}
	if bad := r.modelMismatch(snap); len(bad) > 0 {
		r.fail(after, "the deployments differ from the model: "+strings.Join(bad, "; "))
	}
}

// ledgerOf decodes the standalone host's ledger from a snapshot.
func ledgerOf(snap *wire.Snapshot) (*wire.LedgerView, error) {
	if len(snap.Hosts) != 1 {
		return nil, fmt.Errorf("%d hosts, want the standalone's one", len(snap.Hosts))
	}
	data, _ := json.Marshal(snap.Hosts[0].Ledger)
	var lv wire.LedgerView
	if err := json.Unmarshal(data, &lv); err != nil {
		return nil, fmt.Errorf("the ledger view does not decode: %v", err)
	}
	return &lv, nil
}

// ledgerLimits checks, on every host of a snapshot, that no domain is
// charged over its managed limit and that each domain's charge is the sum
// of its owners' charges.
func ledgerLimits(snap *wire.Snapshot) []string {
	var bad []string
	for _, h := range snap.Hosts {
		if h.Ledger == nil {
			continue // a lost host's ledger is unknown
		}
		data, _ := json.Marshal(h.Ledger)
		var lv wire.LedgerView
		if err := json.Unmarshal(data, &lv); err != nil {
			bad = append(bad, fmt.Sprintf("host %s: the ledger view does not decode: %v", h.Name, err))
			continue
		}
		for _, b := range hostLedgerLimits(&lv) {
			bad = append(bad, "host "+h.Name+": "+b)
		}
	}
	return bad
}

// hostLedgerLimits checks one host's ledger.
func hostLedgerLimits(lv *wire.LedgerView) []string {
	var bad []string
	sums := map[string]int64{}
	for _, o := range lv.Owners {
		for dom, b := range o.Charges {
			if b < 0 {
				bad = append(bad, fmt.Sprintf("owner %s is charged %d in %s", o.ID, b, dom))
			}
			sums[dom] += b
		}
	}
	for _, d := range lv.Domains {
		if d.Charged > d.ManagedLimit {
			bad = append(bad, fmt.Sprintf("%s charged %d over its managed limit %d", d.Name, d.Charged, d.ManagedLimit))
		}
		if d.Charged != sums[d.Name] {
			bad = append(bad, fmt.Sprintf("%s charged %d, its owners sum to %d", d.Name, d.Charged, sums[d.Name]))
		}
	}
	return bad
}

// modelMismatch compares the role's deployments with the model's.
func (r *Runner) modelMismatch(snap *wire.Snapshot) []string {
	var bad []string
	seen := map[string]bool{}
	for _, d := range snap.Deployments {
		seen[d.Name] = true
		m, ok := r.deps[d.Name]
		if !ok || !m.deployed {
			bad = append(bad, "unexpected deployment "+d.Name)
			continue
		}
		if d.Revision != m.revision || d.Desired != m.desired {
			bad = append(bad, fmt.Sprintf("%s is revision %d %s, the model says %d %s", d.Name, d.Revision, d.Desired, m.revision, m.desired))
		}
	}
	for _, n := range r.names {
		if r.deps[n].deployed && !seen[n] {
			bad = append(bad, "deployment "+n+" is missing")
		}
	}
	return bad
}

// quietState is what the quiet points measured.
type quietState struct {
	points  int
	lastRSS float64
	// baselines are the lowest readings seen for each state signature.
	baselines map[string]*baseline
	// lives are the role's resident memory at each quiet point, per life
	// of the role.
	lives [][]float64
	// max readings over the run, for the table.
	maxGoroutines, maxFDs float64
	signatures            map[string]int
}

type baseline struct{ goroutines, fds float64 }

func newQuietState() quietState {
	return quietState{baselines: map[string]*baseline{}, lives: [][]float64{nil}, signatures: map[string]int{}}
}

// newLife starts a new life of the role (its memory starts over).
func (q *quietState) newLife() { q.lives = append(q.lives, nil) }

// rssGrowth names a growth of the role's resident memory over a life, or
// returns "".
func (q *quietState) rssGrowth() string {
	for i, l := range q.lives {
		if len(l) < 12 {
			continue
		}
		firstHalf, lastQuarter := l[:len(l)/2], l[len(l)*3/4:]
		hi := maxOf(firstHalf)
		lo := minOf(lastQuarter)
		allowed := hi + max(Tolerances.RSSBytes, hi*Tolerances.RSSRatio)
		if lo > allowed {
			return fmt.Sprintf("leaked: the role's resident memory grew in its life %d: at least %s over its last quarter of quiet points, at most %s over its first half (allowed %s)",
				i+1, mib(lo), mib(hi), mib(allowed))
		}
	}
	return ""
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func minOf(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

// quietPoint waits for a quiet role (no request in flight, no instance in
// transition) and checks that what it holds is back to the baseline of its
// state.
func (r *Runner) quietPoint() {
	r.reqs.wait()
	r.checkAlways("the requests before a quiet point")
	r.reqs.client.CloseIdleConnections()
	// No instance in transition: each transition is bounded, so this
	// waits at most the longest bound. In the fleet profile, as each host
	// knows it too: the server's view of a host's instances lags (a
	// server just restarted shows what its store had), and a host's drain
	// of an instance whose engine died meanwhile lasts its drain timeout.
	deadline := time.Now().Add(transitionBounds["reconciling"])
	for {
		snap, err := r.snapshot()
		if err != nil {
			r.fail("quiet point", "snapshot: "+err.Error())
		}
		moving := movingIn(snap, "")
		if r.fleet != nil && moving == "" {
			moving = r.fleet.moving()
		}
		if moving == "" {
			break
		}
		if time.Now().After(deadline) {
			r.fail("quiet point", "instance "+moving+" did not settle")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.fleet != nil {
		r.fleet.quietPoint(r)
		return
	}
	// What the role holds converges on its baseline: closed connections,
	// settled requests and ended processes are noticed asynchronously.
	var problems []string
	var reading quietReading
	ok := waitFor(30*time.Second, func() bool {
		reading, problems = r.readQuiet()
		return len(problems) == 0
	})
	if !ok {
		r.fail("quiet point", "leaked: "+strings.Join(problems, "; "))
	}
	r.quiet.record(reading)
}

// record keeps a quiet point's reading: the role's memory for its life,
// and the baseline of its state.
func (q *quietState) record(reading quietReading) {
	q.points++
	q.lastRSS = reading.rss
	q.lives[len(q.lives)-1] = append(q.lives[len(q.lives)-1], reading.rss)
	q.maxGoroutines = max(q.maxGoroutines, reading.goroutines)
	q.maxFDs = max(q.maxFDs, reading.fds)
	q.signatures[reading.signature]++
	if b := q.baselines[reading.signature]; b == nil {
		q.baselines[reading.signature] = &baseline{goroutines: reading.goroutines, fds: reading.fds}
	} else {
		b.goroutines, b.fds = min(b.goroutines, reading.goroutines), min(b.fds, reading.fds)
	}
}

// quietReading is what one quiet check read.
type quietReading struct {
	signature            string
	goroutines, fds, rss float64
}

// readQuiet reads what the role holds and lists what is not back to the
// baseline of its state.
func (r *Runner) readQuiet() (quietReading, []string) {
	lmcache := map[string]bool{}
	for _, d := range r.deps {
		if d.spec.lmcache {
			lmcache[d.spec.name] = true
		}
	}
	return readRole(r.role, lmcache, r.quiet.baselines)
}

// movingIn names an instance of snap in a transitional state ("" when
// none), on host when it is not "".
func movingIn(snap *wire.Snapshot, host string) string {
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			if _, ok := transitionBounds[in.State]; ok {
				if host != "" {
					return in.ID + " " + in.State + " on host " + host
				}
				return in.ID + " " + in.State
			}
		}
	}
	return ""
}

// readRole reads what a role that runs engines (standalone or host) holds
// and lists what is not back to the baseline of its state: its own
// management API (snapshot, /metrics) and the process table. lmcacheDeps
// are the deployments that run an LMCache server.
func readRole(role *harness.Role, lmcacheDeps map[string]bool, baselines map[string]*baseline) (quietReading, []string) {
	var rd quietReading
	var bad []string
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	snap, err := role.Mgmt.Snapshot(ctx)
	if err != nil {
		return rd, []string{"snapshot: " + err.Error()}
	}
	m, err := role.Metrics(ctx)
	if err != nil {
		return rd, []string{"metrics: " + err.Error()}
	}

	// Start slots: none in use when no start runs.
	if n := m.Sum("capyctl_start_slots_in_use"); n != 0 {
		bad = append(bad, fmt.Sprintf("%v start slots in use (%s)", n, series(m, "capyctl_start_slots_in_use")))
	}
	// Admission places: nothing in flight or waiting; cut requests that
	// wait for an idle reading or an abort are settled by now. Those
	// waiting for a stop hold places until their instance stops.
	// Nor does any model wait for a switch, nor any body in a line.
	for _, name := range []string{"capyctl_requests_in_flight", "capyctl_queue_depth", "capyctl_queue_waiting_bytes", "capyctl_switch_queue_length"} {
		if n := m.Sum(name); n != 0 {
			bad = append(bad, fmt.Sprintf("%s %v (%s)", name, n, series(m, name)))
		}
	}
	holding := map[string]bool{}
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			if holdsProcesses(in.State) {
				holding[d.Name] = true
			}
		}
	}
	for series, v := range m {
		if !strings.HasPrefix(series, "capyctl_requests_unsettled{") || v == 0 {
			continue
		}
		dep := label(series, "deployment")
		switch label(series, "settle") {
		case "settle_at_stop":
			if !holding[dep] {
				bad = append(bad, fmt.Sprintf("%v cut requests of %s wait for a stop, but it holds no engine", v, dep))
			}
		default:
			bad = append(bad, fmt.Sprintf("%s = %v", series, v))
		}
	}
	// Turns: a model in memory serves; no turn stays ended or ending once
	// the switch that contended it is over (a gate left closed refuses its
	// ready model's requests for good).
	bad = append(bad, turnsLeftClosed(snap)...)

	// Engines, LMCache servers and their shims: one process group per
	// running engine and per LMCache server, none without an instance.
	wantEngines := map[int]string{}
	wantLMCache := 0
	instances := 0
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			instances++
			if !holdsProcesses(in.State) {
				continue
			}
			if lmcacheDeps[d.Name] && (in.State == "ready" || in.State == "parked") {
				wantLMCache++
			}
			if in.Port == 0 {
				continue // parked with only its LMCache server
			}
			if in.PID <= 0 {
				bad = append(bad, fmt.Sprintf("%s is %s with a port and no engine process", in.ID, in.State))
				continue
			}
			pgid, err := syscall.Getpgid(in.PID)
			if err != nil || !harness.Alive(in.PID) {
				bad = append(bad, fmt.Sprintf("%s is %s on engine %d, which is gone", in.ID, in.State, in.PID))
				continue
			}
			wantEngines[pgid] = in.ID
		}
	}
	groups := launchGroups(role.StateDir)
	engines, lmcache := 0, 0
	for pgid, g := range groups {
		if g.lmcache {
			lmcache++
			continue
		}
		engines++
		if _, ok := wantEngines[pgid]; !ok {
			bad = append(bad, fmt.Sprintf("engine process group %d (%s) runs with no instance recording it", pgid, g.describe()))
		}
	}
	for pgid, id := range wantEngines {
		if _, ok := groups[pgid]; !ok {
			bad = append(bad, fmt.Sprintf("the engine of %s (group %d) is not among the launch processes", id, pgid))
		}
	}
	if lmcache != wantLMCache {
		bad = append(bad, fmt.Sprintf("%d LMCache servers run, %d instances keep one", lmcache, wantLMCache))
	}
	// A deleted deployment leaves no metric series (nor the router state
	// behind them).
	deployedNow := map[string]bool{}
	for _, d := range snap.Deployments {
		deployedNow[d.Name] = true
	}
	gone := map[string]bool{}
	for series := range m {
		if dep := label(series, "deployment"); dep != "" && !deployedNow[dep] {
			gone[dep] = true
		}
	}
	for dep := range gone {
		bad = append(bad, fmt.Sprintf("metric series of deleted deployment %s remain", dep))
	}
	// Connections to engines that stopped: the role keeps none (a pooled
	// one whose engine is gone waits, half closed, for a request that
	// never comes: an open file for good).
	running := map[int]bool{}
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			if holdsProcesses(in.State) && in.Port != 0 {
				running[in.Port] = true
			}
		}
	}
	if cw := closeWaitToGoneEngines(role.PID(), []string{role.Info.Inference, role.Info.Management}, running); len(cw) > 0 {
		bad = append(bad, fmt.Sprintf("the role keeps %d connections to engines that stopped, closed by their end: %s", len(cw), strings.Join(cw, ", ")))
	}
	// Port leases: one per running engine and per LMCache server.
	if v, ok := m.Get("capyctl_engine_port_leases"); !ok || int(v) != len(wantEngines)+lmcache {
		bad = append(bad, fmt.Sprintf("%v engine port leases, %d engines and %d LMCache servers run", v, len(wantEngines), lmcache))
	}
	// Ledger owners: exactly the instances that hold processes, charged
	// what their status says.
	bad = append(bad, ledgerOwners(snap)...)
	// Drivers: at most one process per family.
	drivers := 0
	for _, f := range families {
		p := harness.DriverPIDs(role.StateDir, f)
		drivers += len(p)
		if len(p) > 1 {
			bad = append(bad, fmt.Sprintf("%d %s driver processes run: %v", len(p), f, p))
		}
	}
	// The role's goroutines and open files, against the baseline of the
	// same state.
	rd.goroutines, _ = m.Get("go_goroutines")
	rd.fds, _ = m.Get("process_open_fds")
	rd.rss, _ = m.Get("process_resident_memory_bytes")
	rd.signature = fmt.Sprintf("%d deployments, %d instances, %d engines, %d LMCache servers, %d drivers", len(snap.Deployments), instances, engines, lmcache, drivers)
	if b := baselines[rd.signature]; b != nil {
		if rd.goroutines > b.goroutines+float64(Tolerances.Goroutines) {
			bad = append(bad, fmt.Sprintf("%v role goroutines, %v at the baseline of %s (tolerance %d)", rd.goroutines, b.goroutines, rd.signature, Tolerances.Goroutines))
		}
		if rd.fds > b.fds+float64(Tolerances.OpenFiles) {
			bad = append(bad, fmt.Sprintf("%v role open files, %v at the baseline of %s (tolerance %d)", rd.fds, b.fds, rd.signature, Tolerances.OpenFiles))
		}
	}
	sort.Strings(bad)
	return rd, bad
}

// ledgerOwners checks the ledger's owners are the instances that hold
// processes, with the charges their status shows.
func ledgerOwners(snap *wire.Snapshot) []string {
	lv, err := ledgerOf(snap)
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	insts := map[string]wire.InstanceStatus{}
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			insts[in.ID] = in
		}
	}
	owners := map[string]map[string]int64{}
	for _, o := range lv.Owners {
		owners[o.ID] = o.Charges
		in, ok := insts[o.ID]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("ledger owner %s charged %v, no such instance", o.ID, o.Charges))
		case !holdsProcesses(in.State) && nonZero(o.Charges):
			bad = append(bad, fmt.Sprintf("%s is %s but still charged %v", o.ID, in.State, o.Charges))
		}
	}
	for id, in := range insts {
		if !holdsProcesses(in.State) {
			continue
		}
		c, ok := owners[id]
		if !ok || !nonZero(c) {
			bad = append(bad, fmt.Sprintf("%s is %s with no charge (outside the ledger)", id, in.State))
		} else if !sameCharges(c, in.Charges) {
			bad = append(bad, fmt.Sprintf("%s shows charges %v, the ledger %v", id, in.Charges, c))
		}
	}
	return bad
}

func nonZero(m map[string]int64) bool {
	for _, v := range m {
		if v != 0 {
			return true
		}
	}
	return false
}

func sameCharges(a, b map[string]int64) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

// turnsLeftClosed lists the deployments with a ready instance whose turn
// is not open, from the snapshot's statuses (requests.turn, the router's
// counts; the load view would also read every engine's figures through
// its driver, up to 3 s a deployment).
func turnsLeftClosed(snap *wire.Snapshot) []string {
	var bad []string
	for _, d := range snap.Deployments {
		t, _ := d.Requests["turn"].(string)
		if t == "" || t == "open" {
			continue
		}
		for _, in := range d.Instances {
			if in.State == "ready" {
				bad = append(bad, fmt.Sprintf("%s is ready but its turn is %s", in.ID, t))
			}
		}
	}
	return bad
}

// launchGroup is one process group of the role's launches.
type launchGroup struct {
	pids    []int
	lmcache bool
	dir     string
}

func (g launchGroup) describe() string {
	var cmds []string
	for _, pid := range g.pids {
		cmds = append(cmds, fmt.Sprintf("%d %s", pid, cmdline(pid)))
	}
	return g.dir + ": " + strings.Join(cmds, ", ")
}

// launchGroups are the role's launch processes, by process group: those
// whose working directory is one of its launch directories (engines, LMCache
// servers), and the launch shims of its state directory (whose working
// directory is not: a shim left alone by its engine counts too).
func launchGroups(stateDir string) map[int]launchGroup {
	out := map[int]launchGroup{}
	pids := harness.EnginePIDs(stateDir)
	for _, pid := range harness.Leftovers(stateDir) {
		if strings.Contains(cmdline(pid), "__capyctl_engine_shim") {
			pids = append(pids, pid)
		}
	}
	seen := map[int]bool{}
	for _, pid := range pids {
		if seen[pid] {
			continue
		}
		seen[pid] = true
		pgid, err := syscall.Getpgid(pid)
		if err != nil {
			continue
		}
		g := out[pgid]
		g.pids = append(g.pids, pid)
		if cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); err == nil && strings.HasPrefix(cwd, stateDir+"/") {
			g.dir = strings.TrimPrefix(cwd, stateDir+"/")
			if strings.Contains(cwd, "-lmcache-") {
				g.lmcache = true
			}
		}
		if strings.Contains(cmdline(pid), "lmcache") {
			g.lmcache = true
		}
		out[pgid] = g
	}
	return out
}

// cmdline is a process's command line, spaces between its arguments.
func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return "?"
	}
	return strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
}

// series lists the non-zero series of a metric.
func series(m harness.Metrics, name string) string {
	var out []string
	for s, v := range m {
		if (s == name || strings.HasPrefix(s, name+"{")) && v != 0 {
			out = append(out, fmt.Sprintf("%s=%v", s, v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// label is one label's value of a series.
func label(series, name string) string {
	i := strings.Index(series, name+`="`)
	if i < 0 {
		return ""
	}
	rest := series[i+len(name)+2:]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return rest
}

// waitFor polls cond until it holds or d passes, and says whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	interval := 20 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
		interval = min(2*interval, 500*time.Millisecond)
	}
}
