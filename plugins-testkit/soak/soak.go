// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// Environment variables of a run.
const (
	// EnvSeed reproduces a run: the same seed draws the same operations.
	EnvSeed = "SOAK_SEED"
	// EnvProfile picks the profile: short (the default of go test), long
	// (make soak) or fleet.
	EnvProfile = "SOAK_PROFILE"
	// EnvTable names a file the run writes its Markdown table to.
	EnvTable = "SOAK_TABLE"
	// EnvVerbose prints every operation as it ends.
	EnvVerbose = "SOAK_VERBOSE"
	// EnvOps changes the profile's number of operations (a shorter run
	// while reproducing a failure, a longer one overnight).
	EnvOps = "SOAK_OPS"
)

// Profile sizes a run.
type Profile struct {
	Name string
	// Ops is the operations to run; MaxDuration, when set, ends the run
	// earlier (the long profile: 20,000 operations or 30 minutes).
	Ops         int
	MaxDuration time.Duration
	// QuietEvery is how many operations pass between quiet points.
	QuietEvery int
	// Table prints the table at the end.
	Table bool
	// RoleKill is the weight (in tenths, against 1,020 for every other
	// operation together) of a kill -9 of the role (of the server, in the
	// fleet profile).
	RoleKill int
}

// Profiles.
var (
	Short = Profile{Name: "short", Ops: 500, QuietEvery: 25, RoleKill: 10}
	// Long kills the role about every 1,000 operations: each life has
	// some 20 quiet points for its memory to show a growth.
	Long = Profile{Name: "long", Ops: 20000, MaxDuration: 30 * time.Minute, QuietEvery: 50, Table: true, RoleKill: 1}
)

// ProfileNamed returns a profile by name.
func ProfileNamed(name string) (Profile, bool) {
	switch name {
	case "", "short":
		return withOps(Short), true
	case "long":
		return withOps(Long), true
	case "fleet":
		return withOps(Fleet), true
	}
	return Profile{}, false
}

// withOps applies SOAK_OPS.
func withOps(p Profile) Profile {
	if n, err := strconv.Atoi(os.Getenv(EnvOps)); err == nil && n > 0 {
		p.Ops = n
		if n > Short.Ops {
			p.MaxDuration = 0
		}
	}
	return p
}

// Seed returns SOAK_SEED, or a fresh seed.
func Seed() (uint64, error) {
	if s := os.Getenv(EnvSeed); s != "" {
		return strconv.ParseUint(s, 10, 64)
	}
	return rand.Uint64() >> 1, nil
}

// opRecord is one operation as the failure report prints it.
type opRecord struct {
	n       int
	at      time.Time
	what    string
	outcome string
	took    time.Duration
}

func (o opRecord) String() string {
	return fmt.Sprintf("#%d %s %s → %s (%s)", o.n, o.at.Format("15:04:05.000"), o.what, o.outcome, o.took.Round(time.Millisecond))
}

// Runner is one soak run.
type Runner struct {
	t       testing.TB
	profile Profile
	seed    uint64
	rng     *rand.Rand
	role    *harness.Role
	start   time.Time

	deps  map[string]*depState
	names []string
	// codes are the catalogue's codes and their HTTP statuses (capyctl
	// help exit-codes --json).
	codes map[string]int

	reqs *requests

	ops   int
	last  []opRecord
	stats map[string]*opStats

	quiet     quietState
	roleLives int
	// lives are the role's output of its earlier lives (a restart starts
	// a new one), for the failure report.
	lives []string
	// fleet is the fleet profile's server and hosts (role is the server);
	// nil for a standalone run.
	fleet *fleetParts

	failed bool
}

// depState is the model of one deployment of the pool.
type depState struct {
	spec     depSpec
	deployed bool
	revision uint64
	desired  string
	variant  int
}

// opStats counts one kind of operation.
type opStats struct {
	n        int
	outcomes map[string]int
	took     []time.Duration
}

// Run runs a standalone soak (the short or the long profile).
func Run(t testing.TB, p Profile, seed uint64) {
	r := &Runner{t: t, profile: p, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		deps: map[string]*depState{}, stats: map[string]*opStats{}}
	r.say("soak: seed %d, profile %s (reproduce with %s=%d %s=%s)", seed, p.Name, EnvSeed, seed, EnvProfile, p.Name)
	r.role = harness.StartSimulated(t, simGPU, harness.Options{})
	r.roleLives = 1
	if err := setupEngines(r.role, t); err != nil {
		r.fail("setup", err.Error())
	}
	r.codes = catalogue(t, r.role)
	for _, d := range pool() {
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
	if p.Table {
		r.say("\n%s", table)
	}
	if path := os.Getenv(EnvTable); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Errorf("write %s: %v", path, err)
		}
	}
	r.say("soak: %d operations, seed %d, %s, nothing leaked", r.ops, seed, p.Name)
}

// loop runs the profile's operations, with a quiet point every
// QuietEvery operations and at the end, then checks the role's memory did
// not grow.
func (r *Runner) loop() {
	p := r.profile
	for r.ops < p.Ops && (p.MaxDuration == 0 || time.Since(r.start) < p.MaxDuration) {
		r.step()
		if r.ops%p.QuietEvery == 0 {
			r.quietPoint()
		}
		if r.ops%500 == 0 {
			r.say("soak: %d operations, %s, %d quiet points, role RSS %s", r.ops, time.Since(r.start).Round(time.Second), r.quiet.points, mib(r.quiet.lastRSS))
		}
	}
	r.quietPoint()
	leaked := r.quiet.rssGrowth()
	if r.fleet != nil {
		leaked = r.fleet.rssGrowth()
	}
	if leaked != "" {
		r.fail("end", leaked)
	}
}

// say prints a line to the test log and to stdout (a long run is watched
// as it goes).
func (r *Runner) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if testing.Verbose() {
		fmt.Println(msg)
		return
	}
	r.t.Log(msg)
}

// step draws and runs one operation, then checks the invariants.
func (r *Runner) step() {
	op := r.draw()
	r.ops++
	rec := opRecord{n: r.ops, at: time.Now()}
	what, outcome := op.run(r)
	rec.what, rec.outcome, rec.took = what, outcome, time.Since(rec.at)
	r.record(op.name, rec)
	if os.Getenv(EnvVerbose) != "" {
		r.say("%s", rec)
	}
	r.checkAlways(rec.what)
}

// record keeps an operation for the report and the table.
func (r *Runner) record(kind string, rec opRecord) {
	r.last = append(r.last, rec)
	if len(r.last) > 50 {
		r.last = r.last[len(r.last)-50:]
	}
	s := r.stats[kind]
	if s == nil {
		s = &opStats{outcomes: map[string]int{}}
		r.stats[kind] = s
	}
	s.n++
	s.outcomes[outcomeClass(rec.outcome)]++
	s.took = append(s.took, rec.took)
}

// outcomeClass is an outcome without its detail ("ok", "refused
// capacity_blocked", ...).
func outcomeClass(o string) string {
	if i := strings.Index(o, ":"); i >= 0 {
		o = o[:i]
	}
	return strings.TrimSpace(o)
}

// fail ends the run: the seed, the last 50 operations, the failure, and
// the last line naming it.
func (r *Runner) fail(where, what string) {
	r.t.Helper()
	if r.failed {
		return
	}
	r.failed = true
	var b strings.Builder
	fmt.Fprintf(&b, "soak failed at %s (seed %d, profile %s, after %d operations): %s\n", where, r.seed, r.profile.Name, r.ops, what)
	fmt.Fprintf(&b, "last %d operations:\n", len(r.last))
	for _, o := range r.last {
		fmt.Fprintf(&b, "  %s\n", o)
	}
	if r.role != nil {
		fmt.Fprintf(&b, "role output (last 60 lines):\n%s\n", lastLines(r.role.Output(), 60))
		// Every goroutine's stack goes into the role's output file: what
		// a role that hangs was waiting for.
		if !r.role.QuitWithStacks(15 * time.Second) {
			fmt.Fprintf(&b, "the role did not exit on SIGQUIT within 15 s (killed): no goroutine dump\n")
		}
		if f, err := os.CreateTemp("", fmt.Sprintf("soak-%d-role-*.log", r.seed)); err == nil {
			for i, l := range append(r.lives, r.role.Output()) {
				fmt.Fprintf(f, "==== life %d of the role ====\n%s\n", i+1, l)
			}
			if r.fleet != nil {
				r.fleet.report(f)
			}
			f.Close()
			fmt.Fprintf(&b, "the role's whole output, every life (the fleet's hosts' too, each with its goroutines): %s\n", f.Name())
		}
	}
	fmt.Fprintf(&b, "reproduce: %s=%d %s=%s make soak\n", EnvSeed, r.seed, EnvProfile, r.profile.Name)
	fmt.Fprintf(&b, "soak: %d operations, seed %d, %s, %s", r.ops, r.seed, r.profile.Name, what)
	r.t.Fatal(b.String())
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// catalogue reads the error-code catalogue from the CLI.
func catalogue(t testing.TB, role *harness.Role) map[string]int {
	t.Helper()
	out, errOut, code := harness.RunCLI(t, role.Bin, []string{"help", "exit-codes", "--json"}, nil)
	if code != 0 {
		t.Fatalf("help exit-codes --json: exit %d %s", code, errOut)
	}
	var rows []struct {
		Codes []struct {
			Code string
			HTTP int
		} `json:"codes"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("help exit-codes --json: %v\n%s", err, out)
	}
	codes := map[string]int{}
	for _, row := range rows {
		for _, c := range row.Codes {
			codes[c.Code] = c.HTTP
		}
	}
	if len(codes) == 0 {
		t.Fatalf("the catalogue has no codes:\n%s", out)
	}
	return codes
}

// mib formats bytes in MiB.
func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// ctxFor is a context bounded by d.
func ctxFor(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// lockedSet is a goroutine-safe list of strings.
type lockedSet struct {
	mu sync.Mutex
	v  []string
}

func (s *lockedSet) add(x string) {
	s.mu.Lock()
	s.v = append(s.v, x)
	s.mu.Unlock()
}

func (s *lockedSet) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.v
	s.v = nil
	return v
}
