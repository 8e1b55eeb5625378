// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// Scale sizes a run: the long one (make faults) and the quick one that
// make test runs so the suite's code cannot rot.
type Scale struct {
	// Streams open at once and non-streamed requests a second.
	Streams, Rate int
	// TokenRate is the fake engine's tokens per second; StreamTokens a
	// stream's length in tokens (StreamTokens/TokenRate seconds open).
	TokenRate, StreamTokens int
	// Baseline is the traffic before a fault, Settle the traffic after
	// the role served again and its deployments were back.
	Baseline, Settle time.Duration
	// Recover bounds the wait for the role to serve again and for its
	// deployments to be back.
	Recover time.Duration
	// StopFor is how long a driver stays stopped (SIGSTOP) at most.
	StopFor time.Duration
	// Hold is how long a lasting fault (a full disk, a read-only store,
	// idle connections) lasts under traffic.
	Hold time.Duration
	// IdleConns are the idle connections opened.
	IdleConns int
	// SlowClients drip bodies (as many again drip without the API key).
	SlowClients int
	// BodyReadTimeout is listener.body_read_timeout for the slow-body
	// fault (the default, 60s, would make the row take a minute).
	BodyReadTimeout time.Duration
	// BigClients send BigBodies bodies of 64 MiB each, all at once.
	BigClients, BigBodies int
	// DiskSize is the small filesystem of the full-disk fault.
	DiskSize int64
}

// Full is the scale of make faults: at least 50 open streams and 20
// non-streamed requests a second.
var Full = Scale{
	Streams: 50, Rate: 20, TokenRate: 5, StreamTokens: 75,
	Baseline: 3 * time.Second, Settle: 3 * time.Second, Recover: 90 * time.Second,
	StopFor: 30 * time.Second, IdleConns: 2000, Hold: 12 * time.Second,
	SlowClients: 10, BodyReadTimeout: 5 * time.Second,
	BigClients: 12, BigBodies: 2, DiskSize: 64 << 20,
}

// Quick is the scale of make test: few streams, short windows.
var Quick = Scale{
	Streams: 6, Rate: 4, TokenRate: 5, StreamTokens: 20,
	Baseline: time.Second, Settle: time.Second, Recover: 60 * time.Second,
	StopFor: 10 * time.Second, IdleConns: 100, Hold: 2 * time.Second,
	SlowClients: 2, BodyReadTimeout: 2 * time.Second,
	BigClients: 2, BigBodies: 1, DiskSize: 64 << 20,
}

// Fault is one injected failure.
type Fault struct {
	// Name is the row's first cell.
	Name string
	// Settings are role settings this fault changes from the defaults
	// ("--set" pairs), said in the table.
	Settings func(s Scale) []string
	// StateDir, when set, makes the role's state directory (a small
	// filesystem) or returns why the fault is skipped.
	StateDir func(t testing.TB, s Scale) (dir, skip string)
	// Inject does the fault and undoes it where it lasts (SIGCONT, a disk
	// freed, a file mode restored); it returns when the fault is over.
	Inject func(e *Env)
	// After, when set, runs after the role served again and the settle
	// window, before the traffic stops (a second reading).
	After func(e *Env)
	// Expect checks the fault's own promise against what the row
	// measured (the traffic's outcomes, the engines that survived); the
	// checks made while the fault lasts are in Inject. Both report a
	// missed promise with Env.Miss.
	Expect func(e *Env, got Result)
}

// Result is what a row measured, for Fault.Expect.
type Result struct {
	// Out are the traffic's outcomes from the injection to the end of
	// the settle window.
	Out Outcomes
	// Kept of Of engines run on as the same instance's engine; Gone names
	// the others.
	Kept, Of int
	Gone     []string
}

// Env is what a fault works with.
type Env struct {
	T       testing.TB
	Role    *harness.Role
	Traffic *Traffic
	Scale   Scale
	// Before is the role's state just before the fault.
	Before State
	// Start is when the fault began.
	Start time.Time

	notes []string
	// acked are deployments the role acknowledged during the fault: they
	// must exist after it.
	acked []string
	// misses are the fault's own promises it did not keep.
	misses []string
}

// Miss records a promise of the fault that was not kept: the row's notes
// and problems say it, and the test fails.
func (e *Env) Miss(format string, args ...any) {
	msg := strings.ReplaceAll(fmt.Sprintf(format, args...), e.Role.StateDir, "<state>")
	e.notes = append(e.notes, "MISSED: "+msg)
	e.misses = append(e.misses, msg)
}

// Note adds to the row's notes (the state directory written <state>).
func (e *Env) Note(format string, args ...any) {
	e.notes = append(e.notes, strings.ReplaceAll(fmt.Sprintf(format, args...), e.Role.StateDir, "<state>"))
}

// Acknowledged records a deployment the role accepted during the fault.
func (e *Env) Acknowledged(name string) { e.acked = append(e.acked, name) }

// Retarget points the traffic at the role after a restart.
func (e *Env) Retarget() { e.Traffic.SetTarget(e.Role.InferenceURL(), e.Role.Creds.APIKey) }

// CLI runs a capyctl command against the role with a deadline (a fault
// must not hang the suite) and returns its output, exit code (-1 when
// the deadline killed it) and how long it took.
func (e *Env) CLI(timeout time.Duration, args ...string) (out string, code int, took time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Role.Bin, append(args, "--state-dir", e.Role.StateDir)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + e.Role.StateDir}
	start := time.Now()
	b, err := cmd.CombinedOutput()
	took = time.Since(start)
	switch {
	case ctx.Err() != nil:
		code = -1
	case err != nil:
		code = 1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return string(b), code, took
}

// Row is one fault's line of the table.
type Row struct {
	Fault    string
	Settings string
	// Failed are the requests that failed during the fault, by code.
	Failed string
	// ServedAgain is the longest span, from the fault's beginning to the
	// end of the settle window, in which no request was answered: how long
	// the role did not serve.
	ServedAgain string
	// Engines are the engines that survived (same PIDs).
	Engines string
	// Lost are the deployments and records lost ("none").
	Lost string
	// Ledger is "yes" or what does not add up.
	Ledger string
	Notes  string
	// Skipped says why the fault did not run.
	Skipped string
	// Problems are the goals the fault missed (records lost, ledger
	// inconsistent, never served again).
	Problems []string
}

const (
	engineName = "fake"
	trafficDep = "demo"
	bystander  = "spare"
)

// spec is a deployment on the fake engine with room for the streams.
func spec(name string) string {
	return fmt.Sprintf(`deployment %q {
  engine = %q
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
`, name, engineName, name)
}

// Run starts a standalone role on a simulated GPU with two deployments on
// the fake engine ("demo" under traffic, "spare" idle), puts traffic on
// it, injects the fault and measures the row.
func Run(t testing.TB, f Fault, s Scale) Row {
	row := Row{Fault: f.Name}
	var settings []string
	if f.Settings != nil {
		settings = f.Settings(s)
	}
	row.Settings = "defaults"
	if len(settings) > 0 {
		row.Settings = strings.Join(settings, ", ")
	}
	opts := harness.Options{}
	for _, kv := range settings {
		opts.Args = append(opts.Args, "--set", kv)
	}
	if f.StateDir != nil {
		dir, skip := f.StateDir(t, s)
		if skip != "" {
			row.Skipped = skip
			return row
		}
		opts.StateDir = dir
	}
	r := harness.StartSimulated(t, harness.SimGPU{}, opts)
	r.AddFakeEngine(engineName, "--token-rate", fmt.Sprint(s.TokenRate), "--tokens", "100000",
		"--max-running", "512", "--sim-weights", "2GiB")
	r.MustDeploy(trafficDep, spec(trafficDep))
	r.MustDeploy(bystander, spec(bystander))

	tokensFor := time.Duration(s.StreamTokens/max(s.TokenRate, 1)) * time.Second
	traffic := StartTraffic(TrafficConfig{
		Model: trafficDep, Streams: s.Streams, StreamTokens: s.StreamTokens,
		StreamDeadline: tokensFor + 30*time.Second, Rate: s.Rate, RequestDeadline: 10 * time.Second,
		Lifetime: 8 * time.Minute,
	}, r.InferenceURL(), r.Creds.APIKey)
	defer traffic.Stop()
	harness.Eventually(t, 60*time.Second, fmt.Sprintf("%d streams open", s.Streams), func() bool {
		return traffic.Open() >= s.Streams
	})
	// The baseline is a window of traffic, not a wait for a condition.
	time.Sleep(s.Baseline)
	ctx := context.Background()
	before, err := Observe(ctx, r)
	if err != nil {
		t.Fatalf("observe before %s: %v", f.Name, err)
	}
	if len(before.Ledger) > 0 {
		t.Fatalf("ledger inconsistent before %s: %v", f.Name, before.Ledger)
	}
	base := traffic.Outcomes()
	e := &Env{T: t, Role: r, Traffic: traffic, Scale: s, Before: before, Start: time.Now()}
	f.Inject(e)

	// Served again: a request sent after the fault ended answered 200.
	ended := time.Now()
	if !waitUntil(s.Recover, func() bool { _, ok := traffic.ServedAfter(ended); return ok }) {
		row.ServedAgain = fmt.Sprintf("not within %s of the fault's end", s.Recover)
		row.Problems = append(row.Problems, "never served again")
	}
	// Back: every deployment ready before is ready again.
	back := waitUntil(s.Recover, func() bool {
		st, err := Observe(ctx, r)
		if err != nil {
			return false
		}
		for id, in := range before.Instances {
			if in.State == "ready" && st.Instances[id].State != "ready" {
				return false
			}
		}
		return true
	})
	if !back {
		e.Note("deployments not all ready again within %s", s.Recover)
	}
	// The settle window is traffic after recovery, not a wait.
	time.Sleep(s.Settle)
	if row.ServedAgain == "" {
		row.ServedAgain = fmt.Sprintf("%.1f s", traffic.LongestGap(e.Start, time.Now()).Seconds())
	}
	if f.After != nil {
		f.After(e)
	}
	open := traffic.Open()
	traffic.Stop()
	out := traffic.Outcomes().Sub(base)
	row.Failed = fmt.Sprintf("%s; %d streams open and unbroken at the end", out.Failed(), open)

	after, err := Observe(ctx, r)
	if err != nil {
		row.Lost, row.Ledger = "unknown: "+err.Error(), "unknown"
		row.Problems = append(row.Problems, "role unreadable after the fault: "+err.Error())
		row.Problems = append(row.Problems, e.misses...)
		row.Notes = strings.Join(e.notes, "; ")
		return row
	}
	lost := Lost(before, after)
	for _, name := range e.acked {
		if _, ok := after.Deployments[name]; !ok {
			lost = append(lost, "acknowledged deployment "+name)
		}
	}
	row.Lost = "none"
	if len(lost) > 0 {
		row.Lost = strings.Join(lost, ", ")
		row.Problems = append(row.Problems, "lost "+row.Lost)
	}
	kept, of, gone := Survivors(before, after)
	row.Engines = fmt.Sprintf("%d/%d", kept, of)
	if len(gone) > 0 {
		row.Engines += " (" + strings.Join(gone, "; ") + ")"
	}
	if f.Expect != nil {
		f.Expect(e, Result{Out: out, Kept: kept, Of: of, Gone: gone})
	}
	row.Problems = append(row.Problems, e.misses...)
	row.Ledger = "yes"
	if len(after.Ledger) > 0 {
		row.Ledger = "no: " + strings.Join(after.Ledger, "; ")
		row.Problems = append(row.Problems, "ledger: "+strings.Join(after.Ledger, "; "))
	}
	if d := after.Dropped; d > 0 {
		e.Note("%d request-ledger records dropped", d)
	}
	row.Notes = strings.Join(e.notes, "; ")
	return row
}

// waitUntil polls cond every 100 ms until it holds or the bound passes,
// and says whether it held (a row records a miss instead of failing).
func waitUntil(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Markdown renders rows as a table.
func Markdown(rows []Row) string {
	var b strings.Builder
	b.WriteString("| fault | settings changed | failed during the fault (by code) | served again after (longest span with no answer) | engines survived | deployments and records lost | ledger consistent | notes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(&b, "| %s | | skipped: %s | | | | | |\n", cell(r.Fault), cell(r.Skipped))
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", cell(r.Fault), cell(r.Settings), cell(r.Failed),
			cell(r.ServedAgain), cell(r.Engines), cell(r.Lost), cell(r.Ledger), cell(r.Notes))
	}
	return b.String()
}
