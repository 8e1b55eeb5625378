// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

func TestTransitions_Table(t *testing.T) {
	cases := []struct {
		from, to structs.InstanceState
		ok       bool
	}{
		{structs.StateStopped, structs.StateStarting, true},
		{structs.StateStarting, structs.StateReady, true},
		{structs.StateReady, structs.StateDraining, true},
		{structs.StateDraining, structs.StateParking, true},
		{structs.StateParking, structs.StateParked, true},
		{structs.StateParked, structs.StateWaking, true},
		{structs.StateWaking, structs.StateReady, true},
		{structs.StateReady, structs.StateParked, false},
		// A restart_only instance parked with its LMCache server starts a
		// new engine launch.
		{structs.StateParked, structs.StateStarting, true},
		{structs.StateStopped, structs.StateReady, false},
		{structs.StateFailed, structs.StateReady, false},
		{structs.StateReconciling, structs.StateParked, true},
	}
	for _, c := range cases {
		if got := CanTransition(c.from, c.to); got != c.ok {
			t.Errorf("%s -> %s = %v, want %v", c.from, c.to, got, c.ok)
		}
	}
	for _, s := range States() {
		if s != structs.StateReconciling && !CanTransition(s, structs.StateReconciling) {
			t.Errorf("%s cannot reach reconciling", s)
		}
	}
}

func TestManager_ParkAndWakeOnRequest(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if err := f.m.ParkDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	if s := f.state("a"); s != structs.StateParked {
		t.Fatalf("state %s", s)
	}
	if ph := f.placer.phase("a/0"); ph != "parked" {
		t.Fatalf("ledger phase %q", ph)
	}
	if len(f.m.Routes().Lookup("a").Ready) != 0 {
		t.Fatalf("a parked instance is routable")
	}
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if s := f.state("a"); s != structs.StateReady || f.drv.wakes.Load() != 1 || f.drv.starts.Load() != 1 {
		t.Fatalf("state %s wakes %d starts %d", s, f.drv.wakes.Load(), f.drv.starts.Load())
	}
}

func TestManager_ConcurrentRequestsJoinOneActivation(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.drv.startGate = make(chan struct{})
	f.deploy("a")
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- f.activate("a") }()
	}
	f.eventually("the start to begin", func() bool { return f.drv.starts.Load() == 1 })
	close(f.drv.startGate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.drv.starts.Load(); n != 1 {
		t.Fatalf("started %d times", n)
	}
}

func TestManager_SwitchAlternatingModels(t *testing.T) {
	// The card holds one ready model (6 of 10) and parked residues (1).
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	f.deploy("b")
	for i := 0; i < 6; i++ {
		for _, name := range []string{"a", "b"} {
			if err := f.activate(name); err != nil {
				t.Fatalf("round %d %s: %v", i, name, err)
			}
			other := map[string]string{"a": "b", "b": "a"}[name]
			if s := f.state(name); s != structs.StateReady {
				t.Fatalf("round %d: %s is %s", i, name, s)
			}
			if i > 0 || name == "b" {
				if s := f.state(other); s != structs.StateParked {
					t.Fatalf("round %d: %s is %s, want parked", i, other, s)
				}
				if r := f.inst(other).Released; r != "parked (switch)" {
					t.Fatalf("released %q", r)
				}
			}
		}
	}
	if f.placer.maxSeen > f.placer.capacity {
		t.Fatalf("over capacity: %d > %d", f.placer.maxSeen, f.placer.capacity)
	}
	if f.drv.starts.Load() != 2 {
		t.Fatalf("starts %d: switching must wake, not restart", f.drv.starts.Load())
	}
}

func TestManager_VictimStoppedWhenParkedFootprintDoesNotFit(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.placer.parkedLimit = 0
	f.deploy("a")
	f.deploy("b")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if err := f.activate("b"); err != nil {
		t.Fatal(err)
	}
	if s, r := f.state("a"), f.inst("a").Released; s != structs.StateStopped || r != "stopped (no room to park)" {
		t.Fatalf("a: %s %q", s, r)
	}
}

// TestManager_VictimRules are the rules of the immediate policy (and of an
// operator's start --evict): only idle models are victims.
func TestManager_VictimRules(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(f *fixture)
		wantErr bool
	}{
		{"warm is never evicted", func(f *fixture) {}, true},
		{"a model with waiters is never a victim", func(f *fixture) { f.reqs.waiting["a"] = 1 }, true},
		{"a serving model is not a victim", func(f *fixture) { f.reqs.active["a/0"] = 1 }, true},
		{"an idle model is", func(f *fixture) {}, false},
		{"a model whose last request settles within the admission window is, once settled", func(f *fixture) {
			f.reqs.mu.Lock()
			f.reqs.active["a/0"] = 1
			f.reqs.mu.Unlock()
			time.AfterFunc(50*time.Millisecond, func() {
				f.reqs.mu.Lock()
				f.reqs.active["a/0"] = 0
				f.reqs.mu.Unlock()
			})
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1, func(c *Config) {
				c.AdmissionWindow = 500 * time.Millisecond
				c.Switching.Policy = PolicyImmediate
			})
			warm := c.name == "warm is never evicted"
			f.deploy("a", func(d *structs.Deployment) { d.Lifecycle.Warm = warm })
			f.deploy("b")
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			c.setup(f)
			err := f.activate("b")
			if c.wantErr {
				if !structs.HasCode(err, structs.CodeCapacityBlocked) {
					t.Fatalf("err = %v, want capacity_blocked", err)
				}
				if f.state("a") != structs.StateReady {
					t.Fatalf("a was evicted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestManager_StartWithoutEvictIsCapacityBlocked(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	f.deploy("b")
	ctx := context.Background()
	if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	err := f.m.StartDeployment(ctx, "b", StartOptions{Wait: true})
	if !structs.HasCode(err, structs.CodeCapacityBlocked) || !strings.Contains(err.Error(), "could be evicted: a/0") {
		t.Fatalf("err = %v", err)
	}
	if info := structs.AsError(err).Info(); info.Exit != 4 {
		t.Fatalf("exit %d", info.Exit)
	}
	if err := f.m.StartDeployment(ctx, "b", StartOptions{Wait: true, Evict: true}); err != nil {
		t.Fatalf("start --evict: %v", err)
	}
	if f.state("a") != structs.StateParked || f.state("b") != structs.StateReady {
		t.Fatalf("a %s b %s", f.state("a"), f.state("b"))
	}
}

func TestManager_IdleTimers(t *testing.T) {
	cases := []struct {
		name      string
		residency string
		tiers     []string
		want      []structs.InstanceState
	}{
		{"deep parks then stops", "deep", []string{"deep"}, []structs.InstanceState{structs.StateParked, structs.StateStopped}},
		{"restart only stops", "restart_only", nil, []structs.InstanceState{structs.StateStopped, structs.StateStopped}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1)
			f.drv.tiers = c.tiers
			f.deploy("a", func(d *structs.Deployment) {
				d.Residency = c.residency
				d.Lifecycle.ReadyIdleTimeout = structs.Duration(30 * time.Minute)
				d.Lifecycle.ParkedIdleTimeout = structs.Duration(time.Hour)
			})
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			// A request uses the instance: the router touches its target.
			f.m.Routes().Lookup("a").Ready[0].Touch(f.clock.Now())
			f.clock.Advance(29 * time.Minute)
			f.m.CheckIdle()
			if s := f.state("a"); s != structs.StateReady {
				t.Fatalf("before the timeout: %s", s)
			}
			// The role checks the timers every second; the test checks until
			// the effect shows.
			f.clock.Advance(2 * time.Minute)
			f.eventually("the ready idle timer", func() bool { f.m.CheckIdle(); return f.state("a") == c.want[0] })
			f.clock.Advance(61 * time.Minute)
			f.eventually("the parked idle timer", func() bool { f.m.CheckIdle(); return f.state("a") == c.want[1] })
		})
	}
}

func TestManager_WakeMismatchStops(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if err := f.m.ParkDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	f.drv.wakeCanary = "something else"
	err := f.activate("a")
	if !structs.HasCode(err, structs.CodeWakeMismatch) {
		t.Fatalf("err = %v, want wake_mismatch", err)
	}
	rec := f.inst("a")
	if rec.State != structs.StateStopped || rec.LastError == nil || rec.LastError.Code != structs.CodeWakeMismatch {
		t.Fatalf("after a mismatched wake: %+v", rec)
	}
	if f.placer.phase("a/0") != "" {
		t.Fatalf("memory still charged")
	}
	f.drv.wakeCanary = "ready"
	if err := f.activate("a"); err != nil {
		t.Fatalf("the next request must start it again: %v", err)
	}
}

func TestManager_RetryBudget(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.drv.failStart = sdk.Errorf(sdk.CodeLaunchFailed, "boom")
	f.deploy("a")
	err := f.m.StartDeployment(context.Background(), "a", StartOptions{Wait: true})
	if !structs.HasCode(err, structs.CodeLaunchFailed) {
		t.Fatalf("first attempt: %v", err)
	}
	// --wait ends at once with the reason; the role goes on retrying in the
	// background within the budget.
	f.m.startAll("a", "test")
	gaveUp := func() bool {
		evs, _ := f.st.EventsAfter(0, 1000)
		for _, ev := range evs {
			if ev.Kind == "start_gave_up" {
				return true
			}
		}
		return false
	}
	f.eventually("the budget to run out", gaveUp)
	// The operator's --wait attempt plus the budget of background attempts.
	if n := f.drv.starts.Load(); n != int32(1+f.m.cfg.RetryBudget) {
		t.Fatalf("%d starts, want %d", n, 1+f.m.cfg.RetryBudget)
	}
	if s := f.state("a"); s != structs.StateFailed {
		t.Fatalf("state %s", s)
	}
}

func TestManager_SettleAtStopStopsInsteadOfParking(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	f.reqs.atStop["a/0"] = 2
	if err := f.m.ParkDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	if r := f.inst("a"); r.State != structs.StateStopped || r.Released != "stopped (requests settle at stop)" {
		t.Fatalf("%s %q", r.State, r.Released)
	}
}

func TestManager_RecoverParkedAfterRestart(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if err := f.m.ParkDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	f.m.Close()
	m2 := New(f.cfg)
	if err := m2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	v, err := m2.Deployment("a")
	if err != nil {
		t.Fatal(err)
	}
	if s := v.Instances[0].State; s != structs.StateParked {
		t.Fatalf("recovered %s, want parked", s)
	}
}

func TestManager_StoppedDeploymentRefusesActivation(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.m.StopDeployment(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	// The desired state is stored and published: the router refuses with
	// 409 from the route table, and a restarted role reads the record.
	if r := f.m.Routes().Lookup("a"); r == nil || r.Desired != structs.DesiredStopped {
		t.Fatalf("route after the stop: %+v", r)
	}
	if rec, err := f.st.GetDeployment("a"); err != nil || rec.Desired != structs.DesiredStopped {
		t.Fatalf("stored deployment after the stop: %+v %v", rec, err)
	}
	if err := f.activate("a"); !structs.HasCode(err, structs.CodeDeploymentStopped) {
		t.Fatalf("err = %v", err)
	}
	var e *structs.Error
	if !errors.As(f.activate("a"), &e) || wire.HTTPStatus(e.Code) != 409 {
		t.Fatalf("not a 409")
	}
}

// failingStore is the store with PutInstance failing for the records fail
// picks, as on a full disk.
type failingStore struct {
	*store.Store
	fail func(r *structs.InstanceRecord) bool
}

var errDiskFull = errors.New("write capyctl.db: no space left on device")

func (s *failingStore) PutInstance(r *structs.InstanceRecord) error {
	if s.fail(r) {
		return errDiskFull
	}
	return s.Store.PutInstance(r)
}

func (s *failingStore) PutInstanceEvent(r *structs.InstanceRecord, e *structs.Event, meta map[string]string) error {
	if s.fail(r) {
		return errDiskFull
	}
	return s.Store.PutInstanceEvent(r, e, meta)
}

// TestManager_StartFailsWhenItsRecordCannotBeStored: a request-driven
// start whose launch record, or whose engine's process identities, cannot
// be written fails with store_unavailable, and no engine is left running.
func TestManager_StartFailsWhenItsRecordCannotBeStored(t *testing.T) {
	cases := []struct {
		name string
		fail func(r *structs.InstanceRecord) bool
		// starts and stops the driver saw.
		starts, stops int32
	}{
		// Nothing is launched without its record.
		{"the launch record", func(r *structs.InstanceRecord) bool { return r.State == structs.StateStarting }, 0, 0},
		// A launched engine whose identities cannot be stored is stopped.
		{"the process identities", func(r *structs.InstanceRecord) bool { return r.Launch != nil && r.Launch.Pgid != 0 }, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var failing atomic.Bool
			f := newFixture(t, 10, 6, 1, func(cfg *Config) {
				st := cfg.Store.(*store.Store)
				cfg.Store = &failingStore{Store: st, fail: func(r *structs.InstanceRecord) bool { return failing.Load() && c.fail(r) }}
			})
			f.deploy("a")
			failing.Store(true)
			err := f.activate("a")
			if !structs.HasCode(err, structs.CodeStoreUnavailable) || !errors.Is(err, errDiskFull) {
				t.Fatalf("err = %v, want store_unavailable wrapping the disk error", err)
			}
			if info := structs.AsError(err).Info(); wire.HTTPStatus(info.Code) != 503 || info.Exit != 27 {
				t.Fatalf("catalogue row %+v", info)
			}
			if got, stops := f.drv.starts.Load(), f.drv.stops.Load(); got != c.starts || stops < c.stops {
				t.Fatalf("driver starts %d stops %d, want %d and at least %d", got, stops, c.starts, c.stops)
			}
			rec := f.inst("a")
			if rec.State != structs.StateFailed || rec.LastError == nil || rec.LastError.Code != structs.CodeStoreUnavailable {
				t.Fatalf("instance %s, last error %+v", rec.State, rec.LastError)
			}
			if ph := f.placer.phase("a/0"); ph != "" {
				t.Fatalf("the ledger still charges the instance (%q)", ph)
			}
			if len(f.m.Routes().Lookup("a").Ready) != 0 {
				t.Fatal("the instance is routable")
			}
			// The disk freed, the next request starts it.
			failing.Store(false)
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			if s := f.state("a"); s != structs.StateReady {
				t.Fatalf("state %s after the disk freed", s)
			}
		})
	}
}

// familySource hands out a stub driver per family.
type familySource map[string]*stubDriver

func (s familySource) Driver(_ context.Context, family string) (sdk.Driver, error) {
	return s[family], nil
}
func (s familySource) Describe(ctx context.Context, family string) (*sdk.DescribeResponse, error) {
	return s[family].Describe(ctx, nil)
}

func TestManager_HeldStartDoesNotBlockAnotherFamily(t *testing.T) {
	held, other := newStub(), newStub()
	held.startGate = make(chan struct{})
	defer close(held.startGate)
	// One start slot: a start held in one family used to take the role's
	// only slot, and every other start waited behind it.
	f := newFixture(t, 10, 1, 0, func(c *Config) {
		c.MaxConcurrentEffects = 1
		c.Drivers = familySource{"stub": held, "other": other}
	})
	if err := f.st.PutEngine(&structs.EngineRecord{Name: "other", Family: "other"}); err != nil {
		t.Fatal(err)
	}
	f.deploy("a")
	f.deploy("b", func(d *structs.Deployment) { d.Engine = "other" })
	go func() { _ = f.activate("a") }()
	f.eventually("the start of a held in its driver", func() bool { return held.starts.Load() == 1 })
	if err := f.activate("b"); err != nil {
		t.Fatalf("start on another family while one is held: %v", err)
	}
	if s := f.state("b"); s != structs.StateReady {
		t.Fatalf("b is %s", s)
	}
}

// TestManager_StopDeploymentReportsAFailedStop: a stop the driver cannot
// carry out is the operator's answer when they wait for it.
func TestManager_StopDeploymentReportsAFailedStop(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	f.drv.mu.Lock()
	f.drv.failStop = errors.New("stop not proven")
	f.drv.mu.Unlock()
	if err := f.m.StopDeployment(context.Background(), "a", true); err == nil {
		t.Fatal("a stop the driver failed was reported done")
	}
}

// heldRecordPlacer is the unit placer with what a phase change writes (its
// charge record, the startup peak: PhaseRecorder's record) held, at ready,
// until gate closes, as on a disk whose fsync takes its time under load.
type heldRecordPlacer struct {
	*unitPlacer
	gate    chan struct{}
	records atomic.Int32
}

func (p *heldRecordPlacer) PhaseThen(owner, phase string) (func(), error) {
	err := p.set(owner, phase)
	return func() {
		if phase == "ready" {
			<-p.gate
		}
		p.records.Add(1)
	}, err
}

func (p *heldRecordPlacer) Phase(owner, phase string) error {
	record, err := p.PhaseThen(owner, phase)
	record()
	return err
}

// TestManager_ReadyServesBeforeThePlacersRecords: a started instance is
// routable once its charge is ready, before the placer's writes for the
// phase (its charge record, the startup peak) are done; they are done
// after.
func TestManager_ReadyServesBeforeThePlacersRecords(t *testing.T) {
	var held *heldRecordPlacer
	f := newFixture(t, 10, 6, 1, func(cfg *Config) {
		held = &heldRecordPlacer{unitPlacer: cfg.Placer.(*unitPlacer), gate: make(chan struct{})}
		cfg.Placer = held
	})
	f.deploy("a")
	done := make(chan error, 1)
	go func() { done <- f.activate("a") }()
	opened := false
	defer func() {
		if !opened {
			close(held.gate)
		}
	}()
	f.eventually("routable while the placer's records are held", func() bool { return len(f.m.Routes().Lookup("a").Ready) == 1 })
	if ph := f.placer.phase("a/0"); ph != "ready" {
		t.Fatalf("routable with the charge in phase %q", ph)
	}
	if n := held.records.Load(); n != 0 {
		t.Fatalf("%d records written while held", n)
	}
	opened = true
	close(held.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := held.records.Load(); n != 1 {
		t.Fatalf("%d records written for the ready phase, want 1", n)
	}
}

// chargeRecordPlacer is a unitPlacer with a charge record in the store: a
// plain Reserve writes it at once; a ChargeRecorder's lifecycle writes it
// with the launch record (WithCharge).
type chargeRecordPlacer struct {
	*unitPlacer
	st *store.Store
}

func (p *chargeRecordPlacer) Reserve(ctx context.Context, r Reservation) (*Grant, error) {
	g, err := p.unitPlacer.Reserve(ctx, r)
	if err == nil {
		err = p.st.SetMeta("test/charge/"+r.Owner, "startup")
	}
	return g, err
}

func (p *chargeRecordPlacer) ReserveUnrecorded(ctx context.Context, r Reservation) (*Grant, error) {
	return p.unitPlacer.Reserve(ctx, r)
}

func (p *chargeRecordPlacer) WithCharge(owner string, put func(map[string]string) error) error {
	return put(map[string]string{"test/charge/" + owner: p.phase(owner)})
}

// TestManager_LaunchFollowsOneSyncedWrite: between the plan and the
// launch, a start writes the store once: the launch record, its event and
// the grant's charge record in one transaction, all there when the driver
// is asked to start.
func TestManager_LaunchFollowsOneSyncedWrite(t *testing.T) {
	var st *store.Store
	f := newFixture(t, 10, 6, 1, func(cfg *Config) {
		st = cfg.Store.(*store.Store)
		cfg.Placer = &chargeRecordPlacer{unitPlacer: cfg.Placer.(*unitPlacer), st: st}
	})
	f.deploy("a")
	var planned, started atomic.Uint64
	var seen atomic.Value
	f.drv.onPlan = func() { planned.Store(st.Commits()) }
	f.drv.onStart = func() {
		started.Store(st.Commits())
		var why []string
		if rec, err := st.GetInstance("a", 0); err != nil || rec.State != structs.StateStarting || rec.Launch == nil {
			why = append(why, fmt.Sprintf("launch record %+v (%v)", rec, err))
		}
		if v, err := st.Meta("test/charge/a/0"); err != nil || v != "startup" {
			why = append(why, fmt.Sprintf("charge record %q (%v)", v, err))
		}
		last, _ := st.LatestEventSeq()
		if evs, err := st.EventsAfter(last-1, 1); err != nil || len(evs) != 1 || evs[0].Kind != "instance_starting" {
			why = append(why, fmt.Sprintf("last event %+v (%v)", evs, err))
		}
		seen.Store(strings.Join(why, "; "))
	}
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	if why := seen.Load(); why != "" {
		t.Fatalf("at the launch: %v", why)
	}
	if n := started.Load() - planned.Load(); n != 1 {
		t.Fatalf("%d synced writes between the plan and the launch, want 1", n)
	}
}
