// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"context"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
	"github.com/capyctl/capyctl/sdk"
)

// Tests written against the mutants make mutate found alive in this
// package (website/content/operations/mutation-testing.md).

// TestNew_Defaults: a role gives the placer no host file system and no
// sample interval: it reads the real /proc and samples every 200 ms; what
// it is given it keeps.
func TestNew_Defaults(t *testing.T) {
	p, err := New(Config{Host: "hostA"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.cfg.HostFS != gpu.DefaultHostFS || p.cfg.SampleInterval != 200*time.Millisecond {
		t.Fatalf("defaults: host fs %+v, sample interval %s", p.cfg.HostFS, p.cfg.SampleInterval)
	}
	fs := gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}
	q, err := New(Config{Host: "hostA", HostFS: fs, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.cfg.HostFS != fs || q.cfg.SampleInterval != 5*time.Millisecond {
		t.Fatalf("given: host fs %+v, sample interval %s", q.cfg.HostFS, q.cfg.SampleInterval)
	}
}

// TestPlacer_SizingInputResidency: the effective residency the caller
// gives wins over the spec's; the spec's fills in when none is given.
func TestPlacer_SizingInputResidency(t *testing.T) {
	p, err := New(Config{Host: "hostA"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	spec := &structs.Deployment{Name: "d", Residency: structs.ResidencyRestartOnly}
	if in := p.sizingInput(spec, nil, structs.ResidencyDeep, nil); in.Residency != structs.ResidencyDeep {
		t.Fatalf("residency %q, want the effective %q", in.Residency, structs.ResidencyDeep)
	}
	if in := p.sizingInput(spec, nil, "", nil); in.Residency != structs.ResidencyRestartOnly {
		t.Fatalf("residency %q, want the spec's %q", in.Residency, structs.ResidencyRestartOnly)
	}
}

func TestMeasurementKey(t *testing.T) {
	a := MeasurementKey("m", 1, "h", &structs.EngineRecord{Name: "e", Digest: "sha256:x"})
	b := MeasurementKey("m", 1, "h", &structs.EngineRecord{Name: "e", Digest: "sha256:y"})
	c := MeasurementKey("m", 1, "h", &structs.EngineRecord{Name: "f"})
	if a == b || a != "startup/m/1/h/sha256:x" || c != "startup/m/1/h/f" {
		t.Fatalf("keys %q %q %q: want the installation's digest, else its name", a, b, c)
	}
	if k := MeasurementKey("m", 1, "h", nil); k != "startup/m/1/h/" {
		t.Fatalf("key without an engine %q", k)
	}
}

// TestPlacer_DeviceLimitIsTheCards: a startup estimate above the card's
// managed limit, for a model that fits once ready, sets aside that card's
// whole limit (not the host RAM's, and not nothing).
func TestPlacer_DeviceLimitIsTheCards(t *testing.T) {
	// Two cards of different sizes: the first, with the most room, is the
	// one placed on, and its limit is the one that counts.
	g := cards(2, 24*gib)
	g.devs[1].TotalBytes = 16 * gib
	p := newPlacer(t, g, newMemStore())
	_, err := p.Reserve(context.Background(), lifecycle.Reservation{
		Owner: "w/0", Deployment: &structs.Deployment{Name: "w"}, Revision: 1, Engine: &structs.EngineRecord{Name: "e"},
		Hints:     &sdk.MemoryHints{ReadyDeviceBytes: 10 * gib, ReadyHostBytes: gib, StartupDeviceBytes: 30 * gib},
		Residency: structs.ResidencyRestartOnly,
	})
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	var limit int64
	for _, d := range p.l.Domains() {
		if d.Name == "gpu0" {
			limit = d.ManagedLimit
		}
	}
	if o, _ := p.l.Owner("w/0"); o.Charges["gpu0"] != limit || limit == 0 {
		t.Fatalf("startup charge %v, want the card's whole managed limit %d", o.Charges, limit)
	}
}

// TestPlacer_HostOnlyPeakIsStored: a start that holds nothing on a card
// still has its host peak measured and stored.
func TestPlacer_HostOnlyPeakIsStored(t *testing.T) {
	st := newMemStore()
	p, err := New(Config{Host: "hostA", GPU: cards(1, 24*gib), HostFS: gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}, Store: st, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := &structs.Deployment{Name: "h", Resources: &structs.ResourceSpec{Phases: map[string]structs.PhaseCharge{"ready": {GPU: structs.ByteSize(gib), RAM: 1 << 20}}}}
	if _, err := reserve(p, "h/0", d); err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t)
	p.Launched("h/0", eng.Process.Pid, []structs.ProcessIdentity{{PID: eng.Process.Pid, Role: "engine"}})
	poll.Until(t, 30*time.Second, "a host sample", func() bool {
		mv, _ := p.Memory("h", 1)
		return mv.Startup.ObservedHostBytes > 0
	})
	if err := p.Phase("h/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMeasurement(MeasurementKey("h", 1, "hostA", &structs.EngineRecord{Name: "e", Digest: "sha256:x"}))
	if err != nil || m == nil || m.HostBytes <= 0 || m.DeviceBytes != 0 {
		t.Fatalf("stored %+v %v, want the host peak and nothing on the card", m, err)
	}
}

// TestPlacer_LaunchedWithoutIdentities: a launch with neither an engine
// PID nor a process group is not sampled; one with only a process group is.
func TestPlacer_LaunchedWithoutIdentities(t *testing.T) {
	p := newPlacer(t, cards(1, 24*gib), newMemStore())
	if _, err := reserve(p, "l/0", spec("l", gib, gib)); err != nil {
		t.Fatal(err)
	}
	sampled := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.samples["l/0"] != nil
	}
	p.Launched("l/0", 0, nil)
	if sampled() {
		t.Fatal("a launch without identities is sampled")
	}
	eng := startEngine(t)
	p.Launched("l/0", eng.Process.Pid, nil)
	if !sampled() {
		t.Fatal("a launch known by its process group is not sampled")
	}
}

// TestPlacer_ValidateAgainstTheLargestCard: a deployment that fits only
// the larger of two cards is valid.
func TestPlacer_ValidateAgainstTheLargestCard(t *testing.T) {
	g := cards(2, 16*gib)
	g.devs[1].TotalBytes = 24 * gib
	p := newPlacer(t, g, newMemStore())
	if err := p.Validate(spec("a", 20*gib, gib), nil, &sdk.MemoryHints{}, structs.ResidencyRestartOnly); err != nil {
		t.Fatalf("fits the 24 GiB card: %v", err)
	}
}

// TestPlacer_TheCardWithMostRoomFirst: of two equal cards, a second
// deployment goes to the one the first left free.
func TestPlacer_TheCardWithMostRoomFirst(t *testing.T) {
	p := newPlacer(t, cards(2, 24*gib), newMemStore())
	card := func(owner string) string {
		o, _ := p.l.Owner(owner)
		for dom, b := range o.Charges {
			if dom != "system" && b > 0 {
				return dom
			}
		}
		return ""
	}
	for _, o := range []string{"a/0", "b/0"} {
		if _, err := reserve(p, o, spec(o[:1], 10*gib, gib)); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := card("a/0"), card("b/0"); a == "" || a == b {
		t.Fatalf("a on %q, b on %q: want two cards", a, b)
	}
}

// TestPlacer_PlanFromRefusesUnknownDomains: a recorded plan naming a
// domain this host does not have is refused, whatever the phase.
func TestPlacer_PlanFromRefusesUnknownDomains(t *testing.T) {
	p := newPlacer(t, cards(1, 24*gib), newMemStore())
	for _, ph := range []string{ledger.PhaseStartup, ledger.PhaseReady, ledger.PhaseParked} {
		if _, err := p.planFrom(map[string]map[string]int64{ph: {"gpu9": gib}}); err == nil {
			t.Fatalf("a %s charge on gpu9 was accepted", ph)
		}
	}
}

// TestPlacer_RestoredEnginesAreNotExternal: after a restart, the GPU
// memory of an engine the role recorded (restored, or adopted after it)
// is the role's, not memory held outside CapyCTL; Host reads that afresh.
func TestPlacer_RestoredEnginesAreNotExternal(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	// The real process table: the engine is a live process in its group.
	procPlacer := func() *Placer {
		q, err := New(Config{Host: "hostA", GPU: g, HostFS: gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}, Store: st, SampleInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(q.Close)
		return q
	}
	p := procPlacer()
	if _, err := reserve(p, "a/0", spec("a", 10*gib, gib)); err != nil {
		t.Fatal(err)
	}
	engine := startEngine(t).Process.Pid
	launch := &structs.LaunchRecord{Pgid: engine, Processes: []structs.ProcessIdentity{{PID: engine, Role: "engine"}}}
	const foreign = 999991
	g.set(gpu.ProcessMemory{PID: engine, DeviceUUID: "GPU-a", Bytes: 4 * gib}, gpu.ProcessMemory{PID: foreign, DeviceUUID: "GPU-a", Bytes: 3 * gib})
	external := func(q *Placer) int64 {
		for _, d := range q.Host().Ledger.Domains {
			if d.Name == "gpu0" {
				return d.External
			}
		}
		return -1
	}
	rec := structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateStarting, Launch: launch}

	q := procPlacer()
	q.Restore([]structs.InstanceRecord{rec})
	if e := external(q); e != 3*gib {
		t.Fatalf("external after a restore %d, want only the foreign process's 3 GiB", e)
	}

	r := procPlacer()
	// Restored from a record that knew another launch (the one before a
	// restart of the engine), then adopted with the running one.
	bare := rec
	bare.Launch = &structs.LaunchRecord{Pgid: 1}
	r.Restore([]structs.InstanceRecord{bare})
	r.Adopt("a/0", ledger.PhaseStartup, rec)
	if e := external(r); e != 3*gib {
		t.Fatalf("external after an adopt %d, want only the foreign process's 3 GiB", e)
	}
}

// TestPlacer_AdoptChargesARaiseThatNoLongerFits: an engine adopted in a
// phase whose charge no longer fits is charged anyway: its memory is in
// use.
func TestPlacer_AdoptChargesARaiseThatNoLongerFits(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	p := newPlacer(t, g, st)
	if _, err := reserve(p, "a/0", spec("a", 20*gib, gib)); err != nil {
		t.Fatal(err)
	}
	// Parked (a restart_only plan charges nothing parked): room for b.
	if err := p.Phase("a/0", ledger.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(p, "b/0", spec("b", 10*gib, gib)); err != nil {
		t.Fatal(err)
	}
	q := newPlacer(t, g, st)
	rec := structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateParked, Launch: &structs.LaunchRecord{Pgid: 1}}
	recB := structs.InstanceRecord{Deployment: "b", Index: 0, State: structs.StateStarting, Launch: &structs.LaunchRecord{Pgid: 2}}
	q.Restore([]structs.InstanceRecord{rec, recB})
	q.Adopt("a/0", ledger.PhaseReady, rec)
	if o, _ := q.l.Owner("a/0"); o.Phase != ledger.PhaseReady || o.Charges["gpu0"] != 20*gib {
		t.Fatalf("adopted over the room: %+v, want ready with 20 GiB charged", o)
	}
}

// TestPlacer_HostRefreshesExternal: Host reads what the cards hold
// outside CapyCTL at each call.
func TestPlacer_HostRefreshesExternal(t *testing.T) {
	g := cards(1, 24*gib)
	p := newPlacer(t, g, newMemStore())
	g.set(gpu.ProcessMemory{PID: 999991, DeviceUUID: "GPU-a", Bytes: 3 * gib})
	for _, d := range p.Host().Ledger.Domains {
		if d.Name == "gpu0" && d.External != 3*gib {
			t.Fatalf("external %d after a foreign process took 3 GiB", d.External)
		}
	}
}
