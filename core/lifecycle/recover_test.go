// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// recoverDriver is the stub driver with a scripted answer to Recover.
type recoverDriver struct {
	*stubDriver
	state  sdk.RecoverState
	parked bool
}

func (d *recoverDriver) Recover(context.Context, *sdk.RecoverRequest) (*sdk.RecoverResponse, error) {
	return &sdk.RecoverResponse{State: d.state, Parked: d.parked, Endpoint: sdk.Endpoint{BaseURL: "http://127.0.0.1:1"}}, nil
}

type driverSource struct{ d sdk.Driver }

func (s driverSource) Driver(context.Context, string) (sdk.Driver, error) { return s.d, nil }
func (s driverSource) Describe(ctx context.Context, _ string) (*sdk.DescribeResponse, error) {
	return s.d.Describe(ctx, nil)
}

// TestManager_Recovery restarts the lifecycle over an instance recorded in
// each state that holds processes, with each answer a driver gives to
// Recover, and checks where the instance settles.
func TestManager_Recovery(t *testing.T) {
	running, gone := sdk.RecoverStateRunning, sdk.RecoverStateGone
	cases := []struct {
		name     string
		recorded structs.InstanceState
		answer   sdk.RecoverState
		parked   bool
		want     structs.InstanceState
		// lastError is the code recorded, "" for none.
		lastError structs.Code
		stops     int32
	}{
		{name: "ready and running", recorded: structs.StateReady, answer: running, want: structs.StateReady},
		{name: "ready but gone", recorded: structs.StateReady, answer: gone, want: structs.StateStopped, lastError: structs.CodeEngineError},
		{name: "starting and running", recorded: structs.StateStarting, answer: running, want: structs.StateReady},
		{name: "starting but gone", recorded: structs.StateStarting, answer: gone, want: structs.StateStopped, lastError: structs.CodeEngineError},
		{name: "parked and parked", recorded: structs.StateParked, answer: running, parked: true, want: structs.StateParked},
		{name: "parked but gone", recorded: structs.StateParked, answer: gone, want: structs.StateStopped},
		{name: "a park that completed", recorded: structs.StateParking, answer: running, parked: true, want: structs.StateParked},
		{name: "a park that had not begun", recorded: structs.StateParking, answer: running, want: structs.StateReady},
		{name: "a wake that had not begun", recorded: structs.StateWaking, answer: running, parked: true, want: structs.StateParked},
		{name: "a wake that completed", recorded: structs.StateWaking, answer: running, want: structs.StateReady},
		{name: "a stop in progress is finished", recorded: structs.StateStopping, answer: running, want: structs.StateStopped, stops: 1},
		{name: "draining", recorded: structs.StateDraining, answer: running, want: structs.StateReady},
		{name: "an uncertain re-attach stays reconciling", recorded: structs.StateReady, answer: sdk.RecoverStateUnspecified,
			want: structs.StateReconciling, lastError: structs.CodeUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 10, 6, 1)
			f.deploy("a")
			if err := f.activate("a"); err != nil {
				t.Fatal(err)
			}
			f.m.Close()
			// The role stopped with the instance recorded in c.recorded.
			rec := f.inst("a")
			rec.State, rec.LastError = c.recorded, nil
			if err := f.st.PutInstance(&rec); err != nil {
				t.Fatal(err)
			}
			drv := &recoverDriver{stubDriver: newStub(), state: c.answer, parked: c.parked}
			cfg := f.cfg
			cfg.Drivers = driverSource{drv}
			m2 := New(cfg)
			if err := m2.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer m2.Close()
			v, err := m2.Deployment("a")
			if err != nil {
				t.Fatal(err)
			}
			got := v.Instances[0]
			if got.State != c.want {
				t.Fatalf("recorded %s, driver says %s (parked %v): settled %s, want %s", c.recorded, c.answer, c.parked, got.State, c.want)
			}
			var code structs.Code
			if got.LastError != nil {
				code = got.LastError.Code
			}
			if code != c.lastError {
				t.Fatalf("last error %v, want code %q", got.LastError, c.lastError)
			}
			if n := drv.stops.Load(); n != c.stops {
				t.Fatalf("driver stopped %d times, want %d", n, c.stops)
			}
			// The routes follow: a recovered ready instance serves.
			r := m2.Routes().Lookup("a")
			if serves := r != nil && len(r.Ready) > 0; serves != (c.want == structs.StateReady) {
				t.Fatalf("route %+v for an instance recovered %s", r, c.want)
			}
		})
	}
}
