// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// exitStub is the stub driver with the exit stream: WaitExit blocks until
// an exit is sent on exits (or its context ends); the first breaks calls
// fail as a dying driver's stream does.
type exitStub struct {
	*stubDriver
	exits  chan *sdk.ExitEvent
	breaks atomic.Int32
	calls  atomic.Int32
}

func (d *exitStub) WaitExit(ctx context.Context, r *sdk.WaitExitRequest) (*sdk.ExitEvent, error) {
	d.calls.Add(1)
	if d.breaks.Add(-1) >= 0 {
		return nil, &sdk.Error{Code: sdk.CodeDriverUnavailable, Message: "the driver ended the exit stream without an exit"}
	}
	select {
	case ev := <-d.exits:
		return ev, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type exitSource struct{ d *exitStub }

func (s exitSource) Driver(context.Context, string) (sdk.Driver, error) { return s.d, nil }
func (s exitSource) Describe(ctx context.Context, family string) (*sdk.DescribeResponse, error) {
	return stubSource{s.d.stubDriver}.Describe(ctx, family)
}

// withExitStream makes the fixture's driver serve the exit stream.
func withExitStream(d *exitStub) func(*Config) {
	return func(c *Config) { c.Drivers = exitSource{d} }
}

// TestMonitor_TheExitStreamReportsAnExitAtOnce: a ready engine's exit comes
// from the driver's exit stream, with its code and last lines, though the
// liveness interval (an hour here) would not have polled yet.
func TestMonitor_TheExitStreamReportsAnExitAtOnce(t *testing.T) {
	d := &exitStub{exits: make(chan *sdk.ExitEvent, 1)}
	f := newFixture(t, 10, 4, 1, func(c *Config) { d.stubDriver = c.Drivers.(stubSource).d }, withExitStream(d))
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	f.eventually("the monitor watches the exit stream", func() bool { return d.calls.Load() == 1 })
	d.exits <- &sdk.ExitEvent{Exited: true, ExitCode: 137, LastLogLines: []string{"Killed"}}
	f.eventually("the instance stopped: engine exited", func() bool { return f.state("a") == structs.StateStopped })
	rec := f.inst("a")
	if rec.Reason != structs.ReasonEngineExited || rec.LastError == nil || rec.LastError.Code != structs.CodeEngineError {
		t.Fatalf("after the exit: reason %q, last error %+v; want %q with %s", rec.Reason, rec.LastError, structs.ReasonEngineExited, structs.CodeEngineError)
	}
	if want := "code 137; last log lines:\n  Killed"; !strings.Contains(rec.LastError.Message, want) {
		t.Fatalf("last error %q does not say %q", rec.LastError.Message, want)
	}
}

// TestMonitor_ABrokenExitStreamIsWatchedAgain: a stream that breaks (the
// driver died) is no exit: the engine is probed once, found alive, and
// watched again, and the next stream's exit is reported.
func TestMonitor_ABrokenExitStreamIsWatchedAgain(t *testing.T) {
	d := &exitStub{exits: make(chan *sdk.ExitEvent, 1)}
	d.breaks.Store(2)
	f := newFixture(t, 10, 4, 1, func(c *Config) {
		d.stubDriver = c.Drivers.(stubSource).d
		c.LivenessInterval = 10 * time.Millisecond
	}, withExitStream(d))
	f.deploy("a")
	if err := f.activate("a"); err != nil {
		t.Fatal(err)
	}
	f.eventually("the monitor watches the stream a third time", func() bool { return d.calls.Load() == 3 })
	if s := f.state("a"); s != structs.StateReady {
		t.Fatalf("after two broken streams the instance is %s, want ready (a driver's death says nothing of the engine)", s)
	}
	d.exits <- &sdk.ExitEvent{Exited: true, ExitCode: 1}
	f.eventually("the instance stopped: engine exited", func() bool { return f.state("a") == structs.StateStopped })
}
