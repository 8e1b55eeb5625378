// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
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
