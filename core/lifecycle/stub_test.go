// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
	"github.com/capyctl/capyctl/sdk"
)

// stubDriver is a scriptable driver without processes: the lifecycle's
// logic is tested here; real processes are tested by the whole-role tests.
type stubDriver struct {
	sdk.UnimplementedDriver
	mu        sync.Mutex
	starts    atomic.Int32
	parks     atomic.Int32
	wakes     atomic.Int32
	stops     atomic.Int32
	failStart error
	// failStop fails every Stop (a stop the driver cannot prove).
	failStop error
	// failPlan fails every Plan; notReady makes readiness fail.
	failPlan error
	notReady bool
	// canary answers readiness; wakeCanary answers wake checks.
	canary     string
	wakeCanary string
	parked     map[string]bool
	tiers      []string
	// tierPerPark is the tier_per_park capability; parkedAt and wokeFrom
	// record the tiers of the parks and wakes asked.
	tierPerPark bool
	parkedAt    []string
	wokeFrom    []string
	// startGate, when set, is waited on by Start (to hold a start).
	startGate chan struct{}
	// probeGate, when set, holds every readiness probe until it closes or
	// the probe's context ends (a model that loads for ever).
	probeGate chan struct{}
	probing   atomic.Int32
	// notGone answers that many Stop calls with processes that remain.
	notGone atomic.Int32
	// probeErr, when set, fails every readiness probe with it.
	probeErr error
	// spawnedUnrecorded, when set, is the process group a failed Start
	// left running without answering it (Recover finds it).
	spawnedUnrecorded atomic.Int32
	// stopNeedsIdentity answers a Stop of a launch without identities
	// as the real drivers do: nothing can be proven.
	stopNeedsIdentity bool
	// stopGate, when set, holds every Stop until it closes; stopping
	// counts the Stops that wait there.
	stopGate chan struct{}
	stopping atomic.Int32
	// wakeGate, when set, holds every Wake until it closes or the call's
	// context ends (a wake that never finishes).
	wakeGate chan struct{}
	// onPlan and onStart, when set, run as Plan and Start begin.
	onPlan, onStart func()
}

func newStub() *stubDriver {
	return &stubDriver{canary: "ready", wakeCanary: "ready", parked: map[string]bool{}, tiers: []string{"deep"}}
}

func (d *stubDriver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "stub", Protocol: 1, Capabilities: sdk.Capabilities{APIs: []string{"chat"}, ParkTiers: d.tiers, TierPerPark: d.tierPerPark}}, nil
}

func (d *stubDriver) Plan(_ context.Context, r *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	d.mu.Lock()
	fail := d.failPlan
	d.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	if d.onPlan != nil {
		d.onPlan()
	}
	res := r.Deployment.Residency
	if res == "" {
		res = "deep"
	}
	return &sdk.PlanResponse{Argv: []string{"stub"}, Residency: res, Hints: sdk.MemoryHints{}}, nil
}

func (d *stubDriver) Start(_ context.Context, r *sdk.StartRequest) (*sdk.StartResponse, error) {
	d.starts.Add(1)
	if d.onStart != nil {
		d.onStart()
	}
	if d.startGate != nil {
		<-d.startGate
	}
	d.mu.Lock()
	err := d.failStart
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &sdk.StartResponse{Launch: sdk.Launch{Pgid: 1}, Endpoint: sdk.Endpoint{BaseURL: "http://127.0.0.1:1", ServedName: r.Deployment.ServedName}}, nil
}

func (d *stubDriver) Probe(ctx context.Context, r *sdk.ProbeRequest) (*sdk.ProbeResponse, error) {
	ep := &sdk.Endpoint{BaseURL: "http://127.0.0.1:1", ChatPath: "/v1/chat/completions"}
	if r.Kind == sdk.ProbeKindLiveness {
		return &sdk.ProbeResponse{Alive: true}, nil
	}
	if d.probeGate != nil {
		d.probing.Add(1)
		select {
		case <-d.probeGate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	d.mu.Lock()
	notReady, probeErr := d.notReady, d.probeErr
	d.mu.Unlock()
	if probeErr != nil {
		return nil, probeErr
	}
	if notReady {
		return &sdk.ProbeResponse{Exited: true, Code: "launch_failed", Detail: "the stub exited"}, nil
	}
	return &sdk.ProbeResponse{Alive: true, Ready: true, Endpoint: *ep, Canary: d.canary}, nil
}

func (d *stubDriver) Park(ctx context.Context, r *sdk.ParkRequest) (*sdk.ParkResponse, error) {
	d.parks.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, err // as over gRPC: a call whose deadline passed fails
	}
	d.mu.Lock()
	d.parked[r.InstanceID] = true
	d.parkedAt = append(d.parkedAt, r.Tier)
	d.mu.Unlock()
	return &sdk.ParkResponse{Detail: "parked at " + r.Tier}, nil
}

func (d *stubDriver) Wake(ctx context.Context, r *sdk.WakeRequest) (*sdk.WakeResponse, error) {
	d.wakes.Add(1)
	if d.wakeGate != nil {
		select {
		case <-d.wakeGate:
		case <-ctx.Done():
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err // as over gRPC: a call whose deadline passed fails
	}
	d.mu.Lock()
	delete(d.parked, r.InstanceID)
	d.wokeFrom = append(d.wokeFrom, r.Tier)
	c := d.wakeCanary
	d.mu.Unlock()
	return &sdk.WakeResponse{Canary: c}, nil
}

func (d *stubDriver) Stop(ctx context.Context, r *sdk.StopRequest) (*sdk.StopResponse, error) {
	d.stops.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, err // as over gRPC: a call whose deadline passed fails
	}
	if d.stopGate != nil {
		d.stopping.Add(1)
		<-d.stopGate
	}
	d.mu.Lock()
	fail := d.failStop
	d.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	if d.stopNeedsIdentity && r.Launch != nil && r.Launch.Pgid == 0 {
		return &sdk.StopResponse{Gone: false, Detail: "refusing to signal process group 0"}, nil
	}
	if d.notGone.Add(-1) >= 0 {
		return &sdk.StopResponse{Gone: false, Detail: "the stub's processes remain"}, nil
	}
	d.notGone.Store(0)
	return &sdk.StopResponse{Gone: true}, nil
}

func (d *stubDriver) Recover(_ context.Context, r *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	if r.Launch.Pgid == 0 && d.spawnedUnrecorded.Load() == 0 {
		// As enginekit.RecoverLaunch: nothing recorded, nothing runs.
		return &sdk.RecoverResponse{State: sdk.RecoverStateGone, Detail: "no identities recorded"}, nil
	}
	if r.Launch.Pgid == 0 {
		// A launch whose shim recorded its identities in its directory.
		return &sdk.RecoverResponse{State: sdk.RecoverStateRunning,
			Launch: sdk.Launch{Pgid: d.spawnedUnrecorded.Load(), LaunchDir: r.Launch.LaunchDir}}, nil
	}
	d.mu.Lock()
	parked := d.parked[r.InstanceID]
	d.mu.Unlock()
	return &sdk.RecoverResponse{State: sdk.RecoverStateRunning, Parked: parked,
		Endpoint: sdk.Endpoint{BaseURL: "http://127.0.0.1:1"}}, nil
}

type stubSource struct{ d *stubDriver }

func (s stubSource) Driver(context.Context, string) (sdk.Driver, error) { return s.d, nil }
func (s stubSource) Describe(ctx context.Context, _ string) (*sdk.DescribeResponse, error) {
	return s.d.Describe(ctx, nil)
}

// unitPlacer charges whole units per phase against a capacity and fails the
// test the moment anything would go over it.
type unitPlacer struct {
	t        *testing.T
	mu       sync.Mutex
	capacity int
	ready    int
	parked   int
	// parkedLimit bounds the sum of parked charges (-1 = none).
	parkedLimit int
	// hostCapacity bounds host RAM in units (-1 = none); a park that keeps
	// the weights in host RAM (parked_host) charges hostCopy units there.
	hostCapacity, hostCopy int
	charges                map[string]string
	maxSeen                int
	// shortfalls makes a refusal say what is short, and the placer read
	// its charges (ChargeReader), as the ledger does: switches then know
	// whether one victim alone frees enough.
	shortfalls bool
}

func newPlacer(t *testing.T, capacity, ready, parked int) *unitPlacer {
	return &unitPlacer{t: t, capacity: capacity, ready: ready, parked: parked, parkedLimit: -1, hostCapacity: -1, charges: map[string]string{}}
}

func (p *unitPlacer) cost(phase string) int {
	switch phase {
	case "ready", "startup":
		return p.ready
	case "parked", "parked_host":
		return p.parked
	}
	return 0
}

// hostUsed is the host RAM units charged, except's left out.
func (p *unitPlacer) hostUsed(except string) int {
	n := 0
	for o, ph := range p.charges {
		if o != except && ph == "parked_host" {
			n += p.hostCopy
		}
	}
	return n
}

func (p *unitPlacer) used(except string) (total, parked int) {
	for o, ph := range p.charges {
		if o == except {
			continue
		}
		total += p.cost(ph)
		if ph == "parked" || ph == "parked_host" {
			parked += p.cost(ph)
		}
	}
	return
}

func (p *unitPlacer) set(owner, phase string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	total, parked := p.used(owner)
	if total+p.cost(phase) > p.capacity {
		e := structs.Errf(structs.CodeCapacityBlocked, "need %d units, %d free of %d", p.cost(phase), p.capacity-total, p.capacity)
		if p.shortfalls {
			e.WithDetail("shortfalls", []ledger.Shortfall{{Domain: "units", Need: int64(p.cost(phase)),
				Free: int64(p.capacity - total), Short: int64(total + p.cost(phase) - p.capacity)}})
		}
		return e
	}
	if phase == "parked" && p.parkedLimit >= 0 && parked+p.cost(phase) > p.parkedLimit {
		return structs.Errf(structs.CodeCapacityBlocked, "parked limit")
	}
	if phase == "parked_host" && p.hostCapacity >= 0 && p.hostUsed(owner)+p.hostCopy > p.hostCapacity {
		return structs.Errf(structs.CodeCapacityBlocked, "host RAM: need %d units, %d free", p.hostCopy, p.hostCapacity-p.hostUsed(owner))
	}
	p.charges[owner] = phase
	if t := total + p.cost(phase); t > p.maxSeen {
		p.maxSeen = t
	}
	return nil
}

func (p *unitPlacer) Reserve(_ context.Context, r Reservation) (*Grant, error) {
	return &Grant{}, p.set(r.Owner, "startup")
}
func (p *unitPlacer) Phase(owner, phase string) error { return p.set(owner, phase) }
func (p *unitPlacer) Release(owner string) {
	p.mu.Lock()
	delete(p.charges, owner)
	p.mu.Unlock()
}

// FitsReady implements Forecaster: a ready charge beside the others.
func (p *unitPlacer) FitsReady(owner, _ string) (bool, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	total, _ := p.used(owner)
	return total+p.ready <= p.capacity, true
}

// unitCharges is what the shortfalls placer reads as a ledger's charges.
type unitCharges struct{ *unitPlacer }

// Charges implements ChargeReader: an owner's units now and in each phase.
func (p unitCharges) Charges(owner string) (map[string]int64, map[string]map[string]int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ph, ok := p.charges[owner]
	if !ok {
		return nil, nil, false
	}
	plan := map[string]map[string]int64{}
	for _, x := range []string{ledger.PhaseStartup, ledger.PhaseReady, ledger.PhaseParked} {
		plan[x] = map[string]int64{"units": int64(p.cost(x))}
	}
	return map[string]int64{"units": int64(p.cost(ph))}, plan, true
}

func (p *unitPlacer) phase(owner string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges[owner]
}

// fakeRequests is a scriptable Requests.
type fakeRequests struct {
	mu      sync.Mutex
	active  map[string]int
	waiting map[string]int
	atStop  map[string]int
	service map[string]time.Duration
	rate    map[string]float64
}

func newFakeRequests() *fakeRequests {
	return &fakeRequests{active: map[string]int{}, waiting: map[string]int{}, atStop: map[string]int{}, service: map[string]time.Duration{}, rate: map[string]float64{}}
}
func (f *fakeRequests) Active(i string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active[i]
}
func (f *fakeRequests) SettleAtStop(i string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.atStop[i]
}
func (f *fakeRequests) Stopped(string, uint64) {}
func (f *fakeRequests) Waiting(d string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting[d]
}

// The turn methods of a scripted Requests: a turn ends at once.
func (f *fakeRequests) OldestWaiting(string) (time.Time, bool)             { return time.Time{}, false }
func (f *fakeRequests) Contend(string, int, time.Duration) <-chan struct{} { return closedChan }
func (f *fakeRequests) CloseTurn(string)                                   {}
func (f *fakeRequests) TurnEnded(string) (string, int)                     { return "idle", 0 }
func (f *fakeRequests) Reopen(string)                                      {}
func (f *fakeRequests) ServiceTime(d string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.service[d]
}
func (f *fakeRequests) Places(string) int { return 1 }
func (f *fakeRequests) ArrivalRate(d string) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rate[d]
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
	// auto advances the clock 50 ms at each reading (a bound measured on
	// the clock ends without the test waiting for it).
	auto bool
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.auto {
		c.now = c.now.Add(50 * time.Millisecond)
	}
	return c.now
}
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	t      *testing.T
	m      *Manager
	st     *store.Store
	drv    *stubDriver
	placer *unitPlacer
	reqs   *fakeRequests
	clock  *clock
	cfg    Config
}

// newFixture builds a manager on a real store with a stub driver; capacity
// is in units, a ready model costs ready units and a parked one parked.
func newFixture(t *testing.T, capacity, ready, parked int, mutate ...func(*Config)) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutEngine(&structs.EngineRecord{Name: "stub", Family: "stub"}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, st: st, drv: newStub(), placer: newPlacer(t, capacity, ready, parked), reqs: newFakeRequests(),
		clock: &clock{now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}}
	pool := NewPortPool(30000, 30999)
	pool.free = func(int) bool { return true }
	f.cfg = Config{
		Store: st, Drivers: stubSource{f.drv}, Ports: pool, Placer: f.placer, Requests: f.reqs,
		Host:              Host{Name: "h", StateDir: dir, ModelsRoot: dir},
		Now:               f.clock.Now,
		LivenessInterval:  time.Hour,
		IdleCheckInterval: time.Hour,
		RetryCooldown:     time.Millisecond,
		DrainTimeout:      time.Minute,
		AdmissionWindow:   time.Millisecond,
	}
	for _, mu := range mutate {
		mu(&f.cfg)
	}
	f.m = New(f.cfg)
	if err := f.m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.m.Close(); st.Close() })
	return f
}

// deploy writes a deployment on the stub engine.
func (f *fixture) deploy(name string, mutate ...func(*structs.Deployment)) {
	f.t.Helper()
	spec := &structs.Deployment{Name: name, Engine: "stub", API: "chat", Routes: []string{name}, Instances: 1,
		Lifecycle: structs.LifecycleSpec{Activation: structs.ActivationOnDemand}}
	for _, mu := range mutate {
		mu(spec)
	}
	if _, _, err := f.m.Deploy(context.Background(), spec, DeployOptions{}); err != nil {
		f.t.Fatalf("deploy %s: %v", name, err)
	}
}

func (f *fixture) state(name string) structs.InstanceState {
	f.t.Helper()
	v, err := f.m.Deployment(name)
	if err != nil {
		f.t.Fatal(err)
	}
	return v.Instances[0].State
}

func (f *fixture) inst(name string) structs.InstanceRecord {
	f.t.Helper()
	v, err := f.m.Deployment(name)
	if err != nil {
		f.t.Fatal(err)
	}
	return v.Instances[0]
}

func (f *fixture) activate(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.m.Activate(ctx, name)
}

func (f *fixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	poll.Until(f.t, 10*time.Second, what, cond)
}

// spec is a deployment's current spec.
func (f *fixture) spec(name string) structs.Deployment {
	f.t.Helper()
	dr, ok := f.m.spec(name)
	if !ok {
		f.t.Fatalf("no deployment %s", name)
	}
	return dr.Spec
}
