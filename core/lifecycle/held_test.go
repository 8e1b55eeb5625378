// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/structs"
)

// byIDLocked returns an instance by its ID.
func (m *Manager) byIDLocked(id string) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byID[id]
}

// expectNothingHeld fails the test when a start slot, a port lease or a
// ledger charge outlives what should hold it: no start runs, and charged are the only owners the ledger has.
func (f *fixture) expectNothingHeld(when string, charged ...string) {
	f.t.Helper()
	h := f.m.Held()
	for family, n := range h.StartSlots {
		if n != 0 {
			f.t.Fatalf("%s: %d start slots of %s still in use (of %d)", when, n, family, h.SlotsPerFamily)
		}
	}
	f.placer.mu.Lock()
	owners := len(f.placer.charges)
	f.placer.mu.Unlock()
	if owners != len(charged) {
		f.t.Fatalf("%s: the ledger charges %d owners, want %v", when, owners, charged)
	}
	for _, o := range charged {
		if f.placer.phase(o) == "" {
			f.t.Fatalf("%s: %s is not charged", when, o)
		}
	}
	// One port per charged instance (the stub runs no LMCache server).
	if h.PortLeases != len(charged) {
		f.t.Fatalf("%s: %d ports leased, want %d", when, h.PortLeases, len(charged))
	}
}

// TestStart_FiftyStartsInARow: a start gives back what it holds for its
// own duration (a start slot of the driver's family) when it ends, on
// success as on failure. Before, a successful start kept its slot: with
// max_concurrent_effects = 8, the ninth start of a family waited for ever
// (issue 25). Each case runs 50 starts of one family in a row, each
// followed by what ends the launch, and checks after every one that no
// slot, port or charge is left over.
func TestStart_FiftyStartsInARow(t *testing.T) {
	const starts = 50
	bounded := func(t *testing.T, what string, i int, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f(ctx); err != nil {
			t.Fatalf("%s %d of %d: %v", what, i+1, starts, err)
		}
	}
	cases := []struct {
		name string
		// spec shapes the deployment; setup the fixture.
		spec  func(d *structs.Deployment)
		setup func(f *fixture)
		// cycle starts and ends one launch; it leaves the instance in the
		// state that charges charged owners.
		cycle   func(t *testing.T, f *fixture, i int)
		charged []string
	}{
		{
			name: "operator start and stop",
			cycle: func(t *testing.T, f *fixture, i int) {
				bounded(t, "start", i, func(ctx context.Context) error {
					return f.m.StartDeployment(ctx, "a", StartOptions{Wait: true})
				})
				f.expectNothingHeld("after a successful start", "a/0")
				bounded(t, "stop", i, func(ctx context.Context) error { return f.m.StopDeployment(ctx, "a", true) })
			},
		},
		{
			name: "a request's activation, then an idle stop (restart only)",
			spec: func(d *structs.Deployment) {
				d.Residency = structs.ResidencyRestartOnly
				d.Lifecycle.ReadyIdleTimeout = structs.Duration(time.Minute)
			},
			setup: func(f *fixture) { f.drv.tiers = nil },
			cycle: func(t *testing.T, f *fixture, i int) {
				bounded(t, "activation", i, func(ctx context.Context) error { return f.m.Activate(ctx, "a") })
				f.expectNothingHeld("after an activation", "a/0")
				f.clock.Advance(2 * time.Minute)
				f.eventually("the idle stop", func() bool { f.m.CheckIdle(); return f.state("a") == structs.StateStopped })
			},
		},
		{
			name: "an instance started once, then parked and woken",
			cycle: func(t *testing.T, f *fixture, i int) {
				if i == 0 {
					bounded(t, "start", i, func(ctx context.Context) error {
						return f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true})
					})
				}
				bounded(t, "park", i, func(ctx context.Context) error { return f.m.ParkInstance(ctx, "a", 0, true) })
				bounded(t, "wake", i, func(ctx context.Context) error {
					return f.m.StartInstance(ctx, "a", 0, StartOptions{Wait: true})
				})
			},
		},
		{
			name:  "a start whose engine is never ready",
			setup: func(f *fixture) { f.drv.notReady = true },
			cycle: func(t *testing.T, f *fixture, i int) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true})
				if !structs.HasCode(err, structs.CodeLaunchFailed) {
					t.Fatalf("start %d: %v, want launch_failed", i+1, err)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1)
			if c.setup != nil {
				c.setup(f)
			}
			if c.spec != nil {
				f.deploy("a", c.spec)
			} else {
				f.deploy("a")
			}
			for i := 0; i < starts; i++ {
				c.cycle(t, f, i)
				charged := c.charged
				if s := f.state("a"); s == structs.StateReady || s == structs.StateParked {
					charged = []string{"a/0"}
				}
				f.expectNothingHeld(fmt.Sprintf("after cycle %d", i+1), charged...)
			}
			if n := f.drv.starts.Load() + f.drv.wakes.Load(); n < starts {
				t.Fatalf("the driver saw %d starts and wakes, want at least %d", n, starts)
			}
			// Launch directories are given back too: an instance keeps
			// those of its last few launches.
			if dirs, _ := filepath.Glob(filepath.Join(f.cfg.Host.StateDir, "launches", "a", "*")); len(dirs) > KeptLaunchDirs {
				t.Fatalf("%d launch directories after %d starts, want at most %d", len(dirs), starts, KeptLaunchDirs)
			}
		})
	}
}

// TestDelete_RemovesLaunchDirectories: deleting a deployment, once its
// engines are proven gone, removes its launch directories (and their
// logs); another deployment's stay.
func TestDelete_RemovesLaunchDirectories(t *testing.T) {
	f := newFixture(t, 20, 6, 1)
	f.deploy("a")
	f.deploy("b")
	for _, name := range []string{"a", "b"} {
		if err := f.activate(name); err != nil {
			t.Fatal(err)
		}
	}
	launches := func(dep string) []string {
		dirs, _ := filepath.Glob(filepath.Join(f.cfg.Host.StateDir, "launches", dep, "*"))
		return dirs
	}
	if len(launches("a")) != 1 || len(launches("b")) != 1 {
		t.Fatalf("launch directories %v %v, want one each", launches("a"), launches("b"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.DeleteDeployment(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.cfg.Host.StateDir, "launches", "a")); !os.IsNotExist(err) {
		t.Fatalf("the deleted deployment's launch directories remain: %v", launches("a"))
	}
	if len(launches("b")) != 1 {
		t.Fatalf("b's launch directory went with a's: %v", launches("b"))
	}
}

// TestStart_StopEndsTheWaitForAStartSlot: an operator's stop of an
// instance whose start waits for a start slot (every slot of its family
// taken by starts that load for a long time) ends that wait at once, and
// the stop runs; before, the stop waited behind the start.
func TestStart_StopEndsTheWaitForAStartSlot(t *testing.T) {
	f := newFixture(t, 100, 1, 0, func(c *Config) { c.MaxConcurrentEffects = 1 })
	f.drv.probeGate = make(chan struct{})
	defer close(f.drv.probeGate)
	f.deploy("loading")
	f.deploy("a")
	go func() { _ = f.activate("loading") }()
	f.eventually("the first start to hold the family's only slot", func() bool { return f.drv.probing.Load() == 1 })
	started := make(chan error, 1)
	go func() {
		started <- f.m.StartDeployment(context.Background(), "a", StartOptions{Wait: true})
	}()
	f.eventually("the second start to wait for a slot", func() bool {
		return f.m.Held().StartSlots["stub"] == 1 && f.m.byIDLocked("a/0").busy.Load()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.StopDeployment(ctx, "a", true); err != nil {
		t.Fatalf("stop of a start waiting for a slot: %v", err)
	}
	select {
	case err := <-started:
		if !structs.HasCode(err, structs.CodeLaunchFailed) {
			t.Fatalf("the start the stop ended: %v, want launch_failed", err)
		}
	case <-ctx.Done():
		t.Fatal("the start waiting for a slot did not end")
	}
	if s := f.state("a"); s != structs.StateStopped {
		t.Fatalf("a is %s", s)
	}
	if n := f.m.Held().StartSlots["stub"]; n != 1 {
		t.Fatalf("%d slots in use, want the loading start's 1", n)
	}
}

// TestStart_FailedStartWhoseProcessesRemainIsStoppedByARetry: a start that
// fails after its engine was launched, and whose engine cannot be proven
// gone (its driver died, or its processes outlive the stop), keeps the
// memory charge and the port, stays stopping with the launch recorded
// (TestStart_FailedStartWhoseProcessesRemainIsHeldUntilProven), and its
// stop is retried until it proves the processes gone; only then is
// everything given back. Before, the rollback went on regardless: the
// instance was failed, uncharged, its port free, and its engine ran on
// outside the ledger, unknown to the role even after a restart (found by
// the soak: kill -9 of a driver during a start left an orphan engine).
func TestStart_FailedStartWhoseProcessesRemainIsStoppedByARetry(t *testing.T) {
	f := newFixture(t, 10, 6, 1, func(c *Config) { c.StopRetryCooldown = 20 * time.Millisecond })
	f.drv.notReady = true
	f.drv.notGone.Store(3) // the rollback's stop and two retries
	f.deploy("a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); err == nil {
		t.Fatal("the start succeeded")
	}
	// The retries prove the processes gone; then everything is given back.
	f.eventually("the instance stopped by its retried stop", func() bool { return f.state("a") == structs.StateStopped })
	f.expectNothingHeld("after the retried stop")
	if n := f.drv.stops.Load(); n < 4 {
		t.Fatalf("%d stops, want the rollback's and three more", n)
	}
}

// TestStart_FailedStartWhoseProcessesRemainIsHeldUntilProven checks the
// state in between: stopping, charged, its port leased, the launch
// recorded (so a role restart finishes the stop).
func TestStart_FailedStartWhoseProcessesRemainIsHeldUntilProven(t *testing.T) {
	f := newFixture(t, 10, 6, 1, func(c *Config) { c.StopRetryCooldown = time.Hour })
	f.drv.notReady = true
	f.drv.notGone.Store(1)
	f.deploy("a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); err == nil {
		t.Fatal("the start succeeded")
	}
	rec := f.inst("a")
	if rec.State != structs.StateStopping || rec.Launch == nil || rec.LastError == nil {
		t.Fatalf("instance %s, launch recorded %v, last error %v: want stopping with its launch and the reason", rec.State, rec.Launch != nil, rec.LastError)
	}
	if ph := f.placer.phase("a/0"); ph == "" {
		t.Fatal("the instance whose processes remain is no longer charged")
	}
	if n := f.m.Held().PortLeases; n != 1 {
		t.Fatalf("%d ports leased, want the launch's", n)
	}
	if n := f.m.Held().StartSlots["stub"]; n != 0 {
		t.Fatalf("%d start slots in use after the start ended", n)
	}
	// An operator's stop proves them gone now.
	if err := f.m.StopDeployment(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if s := f.state("a"); s != structs.StateStopped {
		t.Fatalf("after the stop: %s", s)
	}
	f.expectNothingHeld("after the stop")
}

// TestStart_FailedStartWithoutIdentities: a Start that failed answering no
// process identities is proven gone by what the driver's Recover finds
// from the launch directory: nothing (a refusal before anything was
// spawned: the instance is failed, nothing held), or a process group the
// shim recorded (it is stopped, then everything is given back). A Stop of
// a launch without identities proves nothing (the drivers refuse to
// signal group 0): before, such a start stayed stopping for good.
func TestStart_FailedStartWithoutIdentities(t *testing.T) {
	cases := []struct {
		name    string
		spawned int32
	}{
		{"nothing spawned", 0},
		{"its shim recorded a group", 4242},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1)
			f.drv.failStart = structs.Errf(structs.CodeInstallationDrift, "program changed")
			f.drv.stopNeedsIdentity = true
			f.drv.spawnedUnrecorded.Store(c.spawned)
			f.deploy("a")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); !structs.HasCode(err, structs.CodeInstallationDrift) {
				t.Fatalf("start: %v, want installation_drift", err)
			}
			if s := f.state("a"); s != structs.StateFailed {
				t.Fatalf("instance %s, want failed", s)
			}
			f.expectNothingHeld("after the failed start")
			want := int32(1) // the rollback's stop: of the recorded group, or none
			if c.spawned == 0 {
				want = 0
			}
			if n := f.drv.stops.Load(); n != want {
				t.Fatalf("%d stops, want %d", n, want)
			}
		})
	}
}

// TestDeploy_AStartQueuedBehindTheReplacedInstancesStopRunsNothing: a
// request's activation picked an instance just before a new revision
// replaced it, and queued its start behind the stop the update sent. That
// start must not launch an engine: the old instance is closed once the
// new one takes its place, and its engine would run outside any
// deployment, its port leased and its memory charged under the new
// instance's name (found by the soak: an engine no instance records after
// two updates in a row under requests).
func TestDeploy_AStartQueuedBehindTheReplacedInstancesStopRunsNothing(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	starts := f.drv.starts.Load()
	f.drv.stopGate = make(chan struct{})
	updated := make(chan error, 1)
	go func() {
		spec := f.spec("a")
		spec.EngineConfig.MaxConcurrentRequests = 4
		_, _, err := f.m.Deploy(context.Background(), &spec, DeployOptions{ExpectedRevision: 1})
		updated <- err
	}()
	f.eventually("the update's stop of the old instance under way", func() bool { return f.drv.stopping.Load() == 1 })
	old := f.m.byIDLocked("a/0")
	// A request's activation picks the old instance; its start queues
	// behind the stop.
	activated := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		activated <- f.m.Activate(ctx, "a")
	}()
	f.eventually("the activation waiting on the old instance", func() bool {
		f.m.mu.Lock()
		defer f.m.mu.Unlock()
		d := f.m.deployments["a"]
		return d != nil && d.activation != nil
	})
	close(f.drv.stopGate)
	if err := <-updated; err != nil {
		t.Fatalf("update: %v", err)
	}
	// The activation ends one way or the other (refused by the replaced
	// instance, or joined to the new one); what matters is what runs.
	<-activated
	if f.m.byIDLocked("a/0") == old {
		t.Fatal("the old instance was not replaced")
	}
	// Whatever runs is the new instance's: one engine at most, charged
	// and leased once.
	rec := f.inst("a")
	want := 0
	if rec.State == structs.StateReady {
		want = 1
	}
	if n := f.drv.starts.Load() - starts; n != int32(want) {
		t.Fatalf("%d engines launched since the update, the new instance is %s", n, rec.State)
	}
	if h := f.m.Held(); h.PortLeases != want {
		t.Fatalf("%d ports leased, the new instance is %s", h.PortLeases, rec.State)
	}
}

// TestSwitchStats_DeletedDeploymentForgotten: a deleted deployment's
// switching figures (turns it ended, switches it waited for) go with it,
// as its router state does: a role keeps no metric series for every
// deployment it ever deleted. The totals stay.
func TestSwitchStats_DeletedDeploymentForgotten(t *testing.T) {
	f, c := newTurnFixture(t)
	f.deploy("a")
	f.deploy("b")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	c.send("a", "A0") // holds a's only place
	if c.next() != "A0" {
		t.Fatal("A0 was not served at once")
	}
	c.send("b", "B1")
	f.eventually("b to contend a's memory", func() bool { return c.turnGate("a") == "ending" })
	c.done("A0")
	if c.next() != "B1" {
		t.Fatal("B1 was not served after a's turn")
	}
	c.done("B1")
	f.eventually("the switch to b to complete", func() bool { return f.m.SwitchStats().Switches == 1 })
	st := f.m.SwitchStats()
	if st.Turns["a"] != 1 || st.Waits["b"].Count != 1 {
		t.Fatalf("switch stats %+v: a's turn should have ended once and b waited once; the test proves nothing", st)
	}
	for _, dep := range []string{"a", "b"} {
		if err := f.m.DeleteDeployment(context.Background(), dep); err != nil {
			t.Fatalf("delete %s: %v", dep, err)
		}
	}
	st = f.m.SwitchStats()
	if len(st.Turns) != 0 || len(st.Waits) != 0 {
		t.Fatalf("the deleted deployments' figures remain: turns %v, waits %v", st.Turns, st.Waits)
	}
	if st.Switches != 1 || st.TurnReasons[admission.TurnEndedIdle] == 0 {
		t.Fatalf("the totals went too: %+v", st)
	}
}
