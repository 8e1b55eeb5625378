// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// countEvents counts the journaled events of a kind.
func countEvents(t *testing.T, f *fixture, kind string) int {
	t.Helper()
	evs, err := f.st.EventsAfter(0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// TestInstance_Move: a state change goes through the table (an illegal one
// changes nothing), a change of the record within one state is applied
// and a repeat of the state without a change journals nothing, and each
// journaled change says why, and, where it ends a launch, with which code.
// Found by make mutate: each check below fails on one mutant of move
// (instance.go) that the package's tests passed.
func TestInstance_Move(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	in := f.m.byIDLocked("a/0")
	if in == nil {
		t.Fatal("no instance a/0")
	}

	// The same state, no change: nothing is journaled.
	n := countEvents(t, f, "instance_stopped")
	if err := in.transition(structs.StateStopped, "again", nil); err != nil {
		t.Fatal(err)
	}
	if got := countEvents(t, f, "instance_stopped"); got != n {
		t.Fatalf("a repeat of the state journaled %d instance_stopped events, want %d", got, n)
	}

	// The same state with a change: the change is applied, and the
	// event carries the last error's code.
	if err := in.transition(structs.StateStopped, "noted", func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: "it exited"}
	}); err != nil {
		t.Fatal(err)
	}
	if rec := f.inst("a"); rec.LastError == nil || rec.LastError.Code != structs.CodeEngineError {
		t.Fatalf("the change within the state was not applied: last error %+v", rec.LastError)
	}
	ev := lastEvent(t, f, "instance_stopped")
	if ev.Payload["code"] != string(structs.CodeEngineError) || ev.Payload["why"] != "noted" {
		t.Fatalf("instance_stopped payload %v, want code %s and why noted", ev.Payload, structs.CodeEngineError)
	}

	// An illegal change (stopped -> parked) is refused and changes nothing.
	if err := in.transition(structs.StateParked, "illegal", nil); !structs.HasCode(err, structs.CodeConflict) {
		t.Fatalf("stopped -> parked: err = %v, want %s", err, structs.CodeConflict)
	}
	if s := f.state("a"); s != structs.StateStopped {
		t.Fatalf("after a refused change the state is %s", s)
	}

	// A failed launch's event says its code; one without a why has none.
	if err := in.transition(structs.StateStarting, "", nil); err != nil {
		t.Fatal(err)
	}
	if ev := lastEvent(t, f, "instance_starting"); ev.Payload["why"] != nil {
		t.Fatalf("a change without a why journaled why %v", ev.Payload["why"])
	}
	if err := in.transition(structs.StateFailed, "probe", func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: structs.CodeLaunchFailed, Message: "not ready"}
	}); err != nil {
		t.Fatal(err)
	}
	if ev := lastEvent(t, f, "instance_failed"); ev.Payload["code"] != string(structs.CodeLaunchFailed) {
		t.Fatalf("instance_failed payload %v, want code %s", ev.Payload, structs.CodeLaunchFailed)
	}
}

// TestPark_EventSaysTheDriversWord: the instance_parked event names the
// tier the park chose and the driver's word on it.
func TestPark_EventSaysTheDriversWord(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.m.ParkInstance(ctx, "a", 0, true); err != nil {
		t.Fatal(err)
	}
	ev := lastEvent(t, f, "instance_parked")
	if ev.Payload["tier"] != "deep" || ev.Payload["detail"] != "parked at deep" {
		t.Fatalf("instance_parked payload %v, want tier deep and the driver's detail", ev.Payload)
	}
}

// TestStart_EndsItsWaitsWithTheStart: the context of a start's waits (a
// start slot, the readiness probe) ends with the start, whatever its
// outcome. One left open stays among the role's contexts until the role
// stops: memory that grows with every start.
func TestStart_EndsItsWaitsWithTheStart(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	in := f.m.byIDLocked("a/0")
	open := func() bool {
		in.startMu.Lock()
		defer in.startMu.Unlock()
		return in.startCancel != nil
	}
	ctx := in.beginStartup()
	in.endStartup()
	if ctx.Err() == nil || open() {
		t.Fatalf("after endStartup the start's context is open (err %v, cancel kept %v)", ctx.Err(), open())
	}
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if open() {
		t.Fatal("a successful start left its waits' context open")
	}
	if err := f.m.StopDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	f.drv.mu.Lock()
	f.drv.notReady = true
	f.drv.mu.Unlock()
	if err := f.activate("a"); err == nil {
		t.Fatal("a start whose engine is never ready succeeded")
	}
	if open() {
		t.Fatal("a failed start left its waits' context open")
	}
}

// TestResolveEngine_ByRegistrationName: a deployment names an engine by
// its registration, or by its family where one registration has it.
func TestResolveEngine_ByRegistrationName(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	for _, name := range []string{"stub-a", "stub-b"} {
		if err := f.st.PutEngine(&structs.EngineRecord{Name: name, Family: "other"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, want string
		code       structs.Code
	}{
		{"stub-a", "stub-a", ""},
		{"stub", "stub", ""},
		{"other", "", structs.CodeInvalidConfig}, // two registrations
		{"none", "", structs.CodeEngineNotFound},
	} {
		e, err := f.m.resolveEngine(c.name)
		switch {
		case c.code != "" && !structs.HasCode(err, c.code):
			t.Fatalf("%s: err = %v, want %s", c.name, err, c.code)
		case c.code == "" && (err != nil || e.Name != c.want):
			t.Fatalf("%s: %+v, %v; want %s", c.name, e, err, c.want)
		}
	}
}

// TestProbeFailure_Message: a failed readiness probe becomes a coded error
// that says how the engine failed, with the driver's detail once and the
// engine's last log lines where there are any.
func TestProbeFailure_Message(t *testing.T) {
	cases := []struct {
		name string
		p    *sdk.ProbeResponse
		code structs.Code
		msg  string
		// lines: the error carries last_log_lines; exit: exit_code.
		lines, exit bool
	}{
		{"exited without a code", &sdk.ProbeResponse{Exited: true, ExitCode: 3}, structs.CodeLaunchFailed,
			"the engine exited with code 3 while starting", false, true},
		{"exited with the driver's code and detail", &sdk.ProbeResponse{Exited: true, ExitCode: 1, Code: "out_of_memory", Detail: "CUDA out of memory"},
			"out_of_memory", "the engine exited with code 1 while starting: CUDA out of memory", false, true},
		{"not ready in time", &sdk.ProbeResponse{}, structs.CodeStartupTimeout,
			"the engine was not ready within 2s", false, false},
		{"the driver's own account, said once", &sdk.ProbeResponse{Code: "launch_failed", Detail: "no such model"},
			structs.CodeLaunchFailed, "no such model", false, false},
		{"with log lines", &sdk.ProbeResponse{Exited: true, ExitCode: 2, LastLogLines: []string{"a", "b"}}, structs.CodeLaunchFailed,
			"the engine exited with code 2 while starting; last log lines:\n  a\n  b", true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := structs.AsError(probeFailure(c.p, 2*time.Second))
			if e.Code != c.code || e.Message != c.msg {
				t.Fatalf("got %s %q, want %s %q", e.Code, e.Message, c.code, c.msg)
			}
			if _, ok := e.Details["last_log_lines"]; ok != c.lines {
				t.Fatalf("last_log_lines in the details: %v, want %v (%v)", ok, c.lines, e.Details)
			}
			if _, ok := e.Details["exit_code"]; ok != c.exit {
				t.Fatalf("exit_code in the details: %v, want %v (%v)", ok, c.exit, e.Details)
			}
		})
	}
}

// scriptedDriver is the stub driver whose plans a test shapes (edit), and
// which records the plan requests it was asked.
type scriptedDriver struct {
	*stubDriver
	edit func(*sdk.PlanRequest, *sdk.PlanResponse)
	// started, when set, shapes the answers to Start.
	started func(*sdk.StartResponse)
	// probe, when set, replaces the answers to readiness probes.
	probe  *sdk.ProbeResponse
	mu     sync.Mutex
	plans  []*sdk.PlanRequest
	probes []probeCall
	stops  []stopCall
}

// stopCall is a Stop asked: the grace it asks, how long its call's
// context gave it, and whether it names an LMCache server.
type stopCall struct {
	grace, given time.Duration
	server       bool
}

func (d *scriptedDriver) Stop(ctx context.Context, r *sdk.StopRequest) (*sdk.StopResponse, error) {
	given := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		given = time.Until(dl)
	}
	d.mu.Lock()
	d.stops = append(d.stops, stopCall{grace: r.Grace, given: given, server: r.LMCacheServer != nil})
	d.mu.Unlock()
	return d.stubDriver.Stop(ctx, r)
}

// stopped returns the Stops asked so far.
func (d *scriptedDriver) stopped() []stopCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]stopCall(nil), d.stops...)
}

// probeCall is a readiness probe asked: its deadline, and how long its
// call's context gave it.
type probeCall struct {
	deadline, given time.Duration
}

func (d *scriptedDriver) Probe(ctx context.Context, r *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	if r.Kind == sdk.ProbeKindReadiness {
		given := time.Duration(-1)
		if dl, ok := ctx.Deadline(); ok {
			given = time.Until(dl)
		}
		d.mu.Lock()
		d.probes = append(d.probes, probeCall{deadline: r.Deadline, given: given})
		answer := d.probe
		d.mu.Unlock()
		if answer != nil {
			return answer, nil
		}
	}
	return d.stubDriver.Probe(ctx, r)
}

func (d *scriptedDriver) Start(ctx context.Context, r *sdk.StartRequest) (*sdk.StartResponse, error) {
	resp, err := d.stubDriver.Start(ctx, r)
	if err == nil && d.started != nil {
		d.started(resp)
	}
	return resp, err
}

func (d *scriptedDriver) Plan(ctx context.Context, r *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	d.mu.Lock()
	cp := *r // a copy: the nested messages are values
	d.plans = append(d.plans, &cp)
	d.mu.Unlock()
	p, err := d.stubDriver.Plan(ctx, r)
	if err == nil && d.edit != nil {
		d.edit(r, p)
	}
	return p, err
}

// planned returns the plan requests so far.
func (d *scriptedDriver) planned() []*sdk.PlanRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*sdk.PlanRequest(nil), d.plans...)
}

type scriptedSource struct{ d *scriptedDriver }

func (s scriptedSource) Driver(context.Context, string) (sdk.Driver, error) { return s.d, nil }
func (s scriptedSource) Describe(ctx context.Context, _ string) (*sdk.DescribeResponse, error) {
	return s.d.Describe(ctx, nil)
}

// scriptedFixture is a fixture on a scripted driver.
func scriptedFixture(t *testing.T, edit func(*sdk.PlanRequest, *sdk.PlanResponse), mutate ...func(*Config)) (*fixture, *scriptedDriver) {
	drv := &scriptedDriver{stubDriver: newStub(), edit: edit}
	f := newFixture(t, 10, 6, 1, append([]func(*Config){func(cfg *Config) { cfg.Drivers = scriptedSource{drv} }}, mutate...)...)
	f.drv = drv.stubDriver
	return f, drv
}

// runsLMCache is a plan edit: the plan runs a private LMCache server beside
// the engine, as vLLM's and SGLang's drivers do with lmcache set.
func runsLMCache(_ *sdk.PlanRequest, p *sdk.PlanResponse) { p.LMCache = sdk.LMCachePlan{Runs: true} }

// TestPark_LMCacheServer: a restart_only instance with an LMCache server
// parks by stopping its engine alone (the server and its cache stay); one
// whose residency the driver cannot park at stops, server and all.
func TestPark_LMCacheServer(t *testing.T) {
	cases := []struct {
		name      string
		residency string
		state     structs.InstanceState
		kept      bool // the LMCache server stays
	}{
		{"restart only", structs.ResidencyRestartOnly, structs.StateParked, true},
		{"a tier the driver lacks", structs.ResidencyDeep, structs.StateStopped, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, drv := scriptedFixture(t, runsLMCache)
			f.drv.tiers = nil
			drv.started = func(r *sdk.StartResponse) { r.LMCacheServer = &sdk.Launch{Pgid: 7} }
			f.deploy("a", func(d *structs.Deployment) { d.Residency = c.residency })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true}); err != nil {
				t.Fatal(err)
			}
			// The server's processes are recorded as the driver named them.
			if s := f.inst("a").LMCache; s == nil || s.Pgid != 7 {
				t.Fatalf("the start recorded the LMCache server %+v, want the driver's process group 7", s)
			}
			if err := f.m.ParkInstance(ctx, "a", 0, true); err != nil {
				t.Fatal(err)
			}
			rec := f.inst("a")
			if rec.State != c.state || (rec.LMCache != nil) != c.kept {
				t.Fatalf("after the park: %s, LMCache server %+v; want %s, kept %v", rec.State, rec.LMCache, c.state, c.kept)
			}
		})
	}
}

// countingRequests counts the reads of an instance's active requests.
type countingRequests struct {
	*fakeRequests
	reads atomic.Int32
}

func (c *countingRequests) Active(i string) int {
	c.reads.Add(1)
	return c.fakeRequests.Active(i)
}

// TestPark_LastReadyInstanceAdmitsForTheWindow: the deployment's last
// ready instance, asked to park while it serves, keeps admitting (ready,
// routed) for the admission window, ending it early once it is idle; then
// it drains (no park before its requests ended) and parks.
func TestPark_LastReadyInstanceAdmitsForTheWindow(t *testing.T) {
	for _, idle := range []bool{false, true} {
		name := "the window runs out"
		if idle {
			name = "idle within the window"
		}
		t.Run(name, func(t *testing.T) {
			var reqs *countingRequests
			f := newFixture(t, 10, 6, 1, func(cfg *Config) {
				cfg.AdmissionWindow = time.Hour // on the fixture's clock, which stands still
				reqs = &countingRequests{fakeRequests: cfg.Requests.(*fakeRequests)}
				cfg.Requests = reqs
			})
			f.deploy("a")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true}); err != nil {
				t.Fatal(err)
			}
			setActive := func(n int) {
				f.reqs.mu.Lock()
				f.reqs.active["a/0"] = n
				f.reqs.mu.Unlock()
			}
			setActive(1)
			before := reqs.reads.Load()
			parked := make(chan error, 1)
			go func() { parked <- f.m.ParkInstance(ctx, "a", 0, true) }()
			// The park reads the requests again and again within the window.
			f.eventually("the park to wait in the admission window", func() bool { return reqs.reads.Load() >= before+4 })
			if s := f.state("a"); s != structs.StateReady {
				t.Fatalf("within the admission window the last ready instance is %s, want ready", s)
			}
			if !idle {
				f.clock.Advance(2 * time.Hour)
				// It drains: it reads the requests again, parks nothing.
				f.eventually("the drain", func() bool { return f.state("a") == structs.StateDraining })
				before = reqs.reads.Load()
				f.eventually("the drain to wait", func() bool { return reqs.reads.Load() >= before+3 })
				if s, n := f.state("a"), f.drv.parks.Load(); s != structs.StateDraining || n != 0 {
					t.Fatalf("with a request still active: %s, %d parks; want draining, none", s, n)
				}
			}
			setActive(0)
			select {
			case err := <-parked:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("the park did not end once the instance was idle")
			}
			if s := f.state("a"); s != structs.StateParked {
				t.Fatalf("after the drain: %s, want parked", s)
			}
		})
	}
}

// TestPark_NotTheLastReadyInstanceDrainsAtOnce: an instance whose
// deployment has another ready instance drains at once when asked to park
// while it serves (the other one admits); only the last ready one keeps
// admitting for the admission window. The deployment is found by its own
// name as a route, or, where its routes do not name it, among the routes.
func TestPark_NotTheLastReadyInstanceDrainsAtOnce(t *testing.T) {
	for _, routes := range [][]string{{"a"}, {"alias"}} {
		t.Run(routes[0], func(t *testing.T) {
			f := newFixture(t, 20, 6, 1, func(cfg *Config) { cfg.AdmissionWindow = time.Hour })
			f.deploy("a", func(d *structs.Deployment) { d.Instances = 2; d.Routes = routes })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for i := range 2 {
				if err := f.m.StartInstance(ctx, "a", i, StartOptions{Wait: true}); err != nil {
					t.Fatal(err)
				}
			}
			f.reqs.mu.Lock()
			f.reqs.active["a/0"] = 1
			f.reqs.mu.Unlock()
			go func() { _ = f.m.ParkInstance(ctx, "a", 0, true) }()
			f.eventually("a/0 to drain", func() bool {
				v, err := f.m.Deployment("a")
				return err == nil && v.Instances[0].State == structs.StateDraining
			})
			f.reqs.mu.Lock()
			f.reqs.active["a/0"] = 0
			f.reqs.mu.Unlock()
			f.eventually("a/0 to park", func() bool {
				v, err := f.m.Deployment("a")
				return err == nil && v.Instances[0].State == structs.StateParked
			})
		})
	}
}

// TestWake_Timeout: a wake that does not finish fails after the
// deployment's wake timeout (the instance is stopped, wake_failed); the
// default is 5 minutes, past a test's patience: a wake within it succeeds.
func TestWake_Timeout(t *testing.T) {
	for _, declared := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprint(declared), func(t *testing.T) {
			f := newFixture(t, 10, 6, 1)
			f.deploy("a", func(d *structs.Deployment) { d.Timeouts.Wake = structs.Duration(declared) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true}); err != nil {
				t.Fatal(err)
			}
			if err := f.m.ParkInstance(ctx, "a", 0, true); err != nil {
				t.Fatal(err)
			}
			if declared == 0 {
				// The default leaves the wake time enough.
				if err := f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true}); err != nil {
					t.Fatal(err)
				}
				if s := f.state("a"); s != structs.StateReady {
					t.Fatalf("after the wake: %s", s)
				}
				return
			}
			f.drv.wakeGate = make(chan struct{}) // the wake never finishes
			err := f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true})
			if !structs.HasCode(err, structs.CodeWakeFailed) {
				t.Fatalf("a wake past its timeout: err = %v, want %s", err, structs.CodeWakeFailed)
			}
			if s := f.state("a"); s != structs.StateStopped {
				t.Fatalf("after the failed wake: %s, want stopped", s)
			}
		})
	}
}

// TestValidateDeployment_ModelPath: a validation resolves a model the spec
// names (one that is not there is refused before anything is stored), and
// needs none where the spec names none.
func TestValidateDeployment_ModelPath(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	spec := &structs.Deployment{Name: "a", Engine: "stub", API: "chat", Routes: []string{"a"}, Instances: 1}
	if err := f.m.ValidateDeployment(context.Background(), spec); err != nil {
		t.Fatalf("a spec naming no model: %v", err)
	}
	spec.Model.Path = filepath.Join(t.TempDir(), "missing")
	if err := f.m.ValidateDeployment(context.Background(), spec); !structs.HasCode(err, structs.CodeCheckpointUnusable) {
		t.Fatalf("a spec naming a model that is not there: err = %v, want %s", err, structs.CodeCheckpointUnusable)
	}
}

// grantPlacer is the unit placer whose reservations grant what a test says.
type grantPlacer struct {
	*unitPlacer
	grant *Grant
}

func (p grantPlacer) Reserve(ctx context.Context, r Reservation) (*Grant, error) {
	if _, err := p.unitPlacer.Reserve(ctx, r); err != nil {
		return nil, err
	}
	return p.grant, nil
}

// TestStart_PlansAgainWithTheGrant: a start plans again with what the
// ledger's grant placed (devices, bytes, environment), so that the engine
// launches on them; a grant that places nothing keeps the first plan,
// unless an LMCache server's port, leased after it, is to be rendered.
func TestStart_PlansAgainWithTheGrant(t *testing.T) {
	cases := []struct {
		name    string
		grant   *Grant
		lmcache bool
		plans   int
		check   func(second *sdk.PlanRequest) bool
	}{
		{"no grant", nil, false, 1, nil},
		{"a grant of nothing", &Grant{}, false, 1, nil},
		{"device bytes", &Grant{DeviceBytes: 1 << 30, DeviceTotal: 2 << 30, KVBytes: 1 << 20}, false, 2, func(p *sdk.PlanRequest) bool {
			l := &p.Launch
			return l.DeviceBytes == 1<<30 && l.DeviceTotalBytes == 2<<30 && l.KVCacheBytes == 1<<20
		}},
		{"devices", &Grant{DeviceUUIDs: []string{"GPU-1"}}, false, 2, func(p *sdk.PlanRequest) bool {
			return fmt.Sprint(p.Launch.DeviceUUIDs) == "[GPU-1]"
		}},
		{"environment", &Grant{Env: map[string]string{"CUDA_VISIBLE_DEVICES": "1"}}, false, 2, func(p *sdk.PlanRequest) bool {
			return p.Host.HostEnv["CUDA_VISIBLE_DEVICES"] == "1"
		}},
		{"an LMCache server's port", &Grant{}, true, 2, func(p *sdk.PlanRequest) bool { return p.Launch.LMCachePort != 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var edit func(*sdk.PlanRequest, *sdk.PlanResponse)
			if c.lmcache {
				edit = runsLMCache
			}
			f, drv := scriptedFixture(t, edit, func(cfg *Config) {
				cfg.Placer = grantPlacer{unitPlacer: cfg.Placer.(*unitPlacer), grant: c.grant}
			})
			f.deploy("a")
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			plans := drv.planned()
			if len(plans) != c.plans {
				t.Fatalf("%d plans, want %d", len(plans), c.plans)
			}
			if c.check != nil && !c.check(plans[1]) {
				t.Fatalf("the second plan lacks what the grant placed: launch %v, host %v", &plans[1].Launch, &plans[1].Host)
			}
		})
	}
}

// TestStart_RecordsTheLaunch: each launch is recorded with a generation
// above the one before (requests and metrics of an older launch are told
// apart by it) and with the parsers the plan chose, none where it chose
// none.
func TestStart_RecordsTheLaunch(t *testing.T) {
	cases := []struct {
		name    string
		parsers sdk.Parsers
		want    *structs.Parsers
	}{
		{"no parsers", sdk.Parsers{}, nil},
		{"a tool-call parser", sdk.Parsers{ToolCall: "hermes"}, &structs.Parsers{ToolCall: "hermes"}},
		{"a reasoning parser", sdk.Parsers{Reasoning: "qwen3"}, &structs.Parsers{Reasoning: "qwen3"}},
		{"only the provenance", sdk.Parsers{Provenance: "off"}, &structs.Parsers{Provenance: "off"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, _ := scriptedFixture(t, func(_ *sdk.PlanRequest, p *sdk.PlanResponse) { p.Parsers = c.parsers })
			f.deploy("a")
			var gen uint64
			for i := range 2 {
				if err := f.m.StartDeployment(context.Background(), "a", StartOptions{Wait: true}); err != nil {
					t.Fatal(err)
				}
				rec := f.inst("a")
				if rec.Generation <= gen {
					t.Fatalf("launch %d: generation %d after %d", i+1, rec.Generation, gen)
				}
				gen = rec.Generation
				if fmt.Sprint(rec.Parsers) != fmt.Sprint(c.want) {
					t.Fatalf("parsers %+v, want %+v", rec.Parsers, c.want)
				}
				if err := f.m.StopDeployment(context.Background(), "a", true); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestStart_ProbeDeadline: the readiness probe's deadline is the
// deployment's initialize timeout, else the driver's plan's, else the
// role's default; the probe's call is given seconds more than that, so
// that the driver answers with its own account of a slow start rather
// than being cut off.
func TestStart_ProbeDeadline(t *testing.T) {
	cases := []struct {
		name       string
		plan       time.Duration // the plan's StartupTimeout
		initialize time.Duration
		want       time.Duration
	}{
		{"the plan's", 30 * time.Second, 0, 30 * time.Second},
		{"the deployment's", 30 * time.Second, 5 * time.Second, 5 * time.Second},
		{"the default", 0, 0, 7 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, drv := scriptedFixture(t, func(_ *sdk.PlanRequest, p *sdk.PlanResponse) { p.StartupTimeout = c.plan },
				func(cfg *Config) { cfg.DefaultStartupTimeout = 7 * time.Second })
			f.deploy("a", func(d *structs.Deployment) { d.Timeouts.Initialize = structs.Duration(c.initialize) })
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			drv.mu.Lock()
			probes := append([]probeCall(nil), drv.probes...)
			drv.mu.Unlock()
			if len(probes) != 1 {
				t.Fatalf("%d readiness probes, want 1", len(probes))
			}
			if p := probes[0]; p.deadline != c.want || p.given < c.want+5*time.Second {
				t.Fatalf("probe deadline %s given %s; want %s, given seconds more", p.deadline, p.given, c.want)
			}
		})
	}
}

// TestStart_EndpointAndCanary: a ready instance serves at the endpoint its
// readiness probe named, else at the one its Start answered; it keeps the
// wake check's answer of its first start (a later launch does not replace
// it: a wake is compared with what the model answered first).
func TestStart_EndpointAndCanary(t *testing.T) {
	f, drv := scriptedFixture(t, nil)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	rec := f.inst("a")
	if rec.Endpoint == nil || rec.Endpoint.ChatPath != "/v1/chat/completions" {
		t.Fatalf("endpoint %+v, want the probe's (with its chat path)", rec.Endpoint)
	}
	if rec.Canary != "ready" {
		t.Fatalf("canary %q, want the first start's ready", rec.Canary)
	}
	if err := f.m.StopDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	// A probe that names no endpoint, with another canary.
	drv.mu.Lock()
	drv.probe = &sdk.ProbeResponse{Alive: true, Ready: true, Canary: "other"}
	drv.mu.Unlock()
	if err := f.m.StartDeployment(context.Background(), "a", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	rec = f.inst("a")
	if rec.Endpoint == nil || rec.Endpoint.BaseURL != "http://127.0.0.1:1" || rec.Endpoint.ChatPath != "" {
		t.Fatalf("endpoint %+v, want the Start's", rec.Endpoint)
	}
	if rec.Canary != "ready" {
		t.Fatalf("canary %q after a second launch, want the first start's ready", rec.Canary)
	}
}

// TestStart_FailedStartWhoseShimRecordedAGroupThatRemains: a Start that
// failed answering no identities, whose shim recorded a process group
// that a stop cannot prove gone: the instance stays stopping and its
// record now names that group, so that its retried stop, or a role
// restart, signals it.
func TestStart_FailedStartWhoseShimRecordedAGroupThatRemains(t *testing.T) {
	f := newFixture(t, 10, 6, 1, func(c *Config) { c.StopRetryCooldown = time.Hour })
	f.drv.failStart = structs.Errf(structs.CodeInstallationDrift, "program changed")
	f.drv.stopNeedsIdentity = true
	f.drv.spawnedUnrecorded.Store(4242)
	f.drv.notGone.Store(1)
	f.deploy("a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); err == nil {
		t.Fatal("the start succeeded")
	}
	rec := f.inst("a")
	if rec.State != structs.StateStopping || rec.Launch == nil || rec.Launch.Pgid != 4242 {
		t.Fatalf("instance %s, launch %+v: want stopping, the launch naming group 4242", rec.State, rec.Launch)
	}
}

// TestStop_GivesTheDriverMoreThanTheGrace: a stop asks the driver to wait
// the grace for the engine to exit and gives its call seconds more (to
// kill what did not exit and prove it gone).
func TestStop_GivesTheDriverMoreThanTheGrace(t *testing.T) {
	f, drv := scriptedFixture(t, nil, func(cfg *Config) { cfg.StopGrace = 2 * time.Second })
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if err := f.m.StopDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	stops := drv.stopped()
	if len(stops) != 1 {
		t.Fatalf("%d stops, want 1", len(stops))
	}
	if s := stops[0]; s.grace != 2*time.Second || s.given < s.grace+20*time.Second {
		t.Fatalf("the stop asked a grace of %s and was given %s; want 2s, and seconds more", s.grace, s.given)
	}
}

// TestStop_SaysTheDriversAccount: a stop that cannot prove the engine gone
// fails with still_stopping and the driver's own account of why.
func TestStop_SaysTheDriversAccount(t *testing.T) {
	f := newFixture(t, 10, 6, 1, func(c *Config) { c.StopRetryCooldown = time.Hour })
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	f.drv.notGone.Store(1)
	err := f.m.StopDeployment(context.Background(), "a", true)
	if !structs.HasCode(err, structs.CodeStillStopping) || !strings.Contains(err.Error(), "the stub's processes remain") {
		t.Fatalf("err = %v, want %s with the driver's account", err, structs.CodeStillStopping)
	}
	if rec := f.inst("a"); rec.LastError == nil || !strings.Contains(rec.LastError.Message, "the stub's processes remain") {
		t.Fatalf("last error %+v, want the driver's account", rec.LastError)
	}
}

// TestStop_AFailedInstanceEndsItsLMCacheServer: a failed instance that
// still records an LMCache server (a failed start may leave one) ends it
// when stopped, and forgets it only once proven gone.
func TestStop_AFailedInstanceEndsItsLMCacheServer(t *testing.T) {
	f, drv := scriptedFixture(t, runsLMCache)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	in := f.m.byIDLocked("a/0")
	// The engine failed; the record still names the server.
	if err := in.transition(structs.StateFailed, "test: the engine failed", nil); err != nil {
		t.Fatal(err)
	}
	if f.inst("a").LMCache == nil {
		t.Fatal("no LMCache server recorded")
	}
	if err := f.m.StopDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	rec := f.inst("a")
	if rec.State != structs.StateStopped || rec.LMCache != nil {
		t.Fatalf("after the stop: %s, LMCache server %+v; want stopped, none", rec.State, rec.LMCache)
	}
	stops := drv.stopped()
	if len(stops) != 1 || !stops[0].server {
		t.Fatalf("stops %+v, want one naming the LMCache server", stops)
	}
}
