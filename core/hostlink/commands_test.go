// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// fakeHandler records the commands it carries out and answers err.
type fakeHandler struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fakeHandler) record(what string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, what)
	return f.err
}

func (f *fakeHandler) StartInstance(_ context.Context, c *hostv1.StartInstance) error {
	return f.record("start " + c.InstanceId)
}
func (f *fakeHandler) ParkInstance(_ context.Context, c *hostv1.ParkInstance) error {
	return f.record("park " + c.InstanceId + " " + c.Tier)
}
func (f *fakeHandler) WakeInstance(_ context.Context, c *hostv1.WakeInstance) error {
	return f.record("wake " + c.InstanceId)
}
func (f *fakeHandler) StopInstance(_ context.Context, c *hostv1.StopInstance) error {
	return f.record("stop " + c.InstanceId)
}
func (f *fakeHandler) AbortRequest(_ context.Context, c *hostv1.AbortRequest) error {
	return f.record("abort " + c.InstanceId + " " + c.RequestId)
}

func (f *fakeHandler) DeploymentAction(_ context.Context, c *hostv1.DeploymentAction) error {
	return f.record(fmt.Sprintf("%s %s %d", c.Action, c.Deployment, c.Instance))
}

func (f *fakeHandler) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func TestDeduper_Execute(t *testing.T) {
	cases := []struct {
		name      string
		cmd       *hostv1.Command
		err       error
		wantCalls []string
		wantCode  string
	}{
		{name: "start", cmd: &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Start{Start: &hostv1.StartInstance{InstanceId: "i1"}}},
			wantCalls: []string{"start i1"}},
		{name: "park", cmd: &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Park{Park: &hostv1.ParkInstance{InstanceId: "i1", Tier: "deep"}}},
			wantCalls: []string{"park i1 deep"}},
		{name: "wake", cmd: &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Wake{Wake: &hostv1.WakeInstance{InstanceId: "i1"}}},
			wantCalls: []string{"wake i1"}},
		{name: "stop", cmd: &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Stop{Stop: &hostv1.StopInstance{InstanceId: "i1"}}},
			wantCalls: []string{"stop i1"}},
		{name: "a deployment's park", cmd: &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Deployment{Deployment: &hostv1.DeploymentAction{Deployment: "chat", Action: "park", Instance: -1}}},
			wantCalls: []string{"park chat -1"}},
		{name: "abort", cmd: &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Abort{Abort: &hostv1.AbortRequest{InstanceId: "i1", RequestId: "r9"}}},
			wantCalls: []string{"abort i1 r9"}},
		{name: "a coded refusal keeps its code", err: structs.Errf(structs.CodeCapacityBlocked, "no room"),
			cmd:       &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Start{Start: &hostv1.StartInstance{InstanceId: "i1"}}},
			wantCalls: []string{"start i1"}, wantCode: string(structs.CodeCapacityBlocked)},
		{name: "a foreign error is internal", err: fmt.Errorf("driver gone"),
			cmd:       &hostv1.Command{CommandId: "c", Action: &hostv1.Command_Wake{Wake: &hostv1.WakeInstance{InstanceId: "i1"}}},
			wantCalls: []string{"wake i1"}, wantCode: string(structs.CodeInternal)},
		{name: "no action", cmd: &hostv1.Command{CommandId: "c"}, wantCode: string(structs.CodeInvalidRequest)},
		{name: "no command id", cmd: &hostv1.Command{Action: &hostv1.Command_Wake{Wake: &hostv1.WakeInstance{InstanceId: "i1"}}},
			wantCode: string(structs.CodeInvalidRequest)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &fakeHandler{err: c.err}
			res, err := NewDeduper(0).Execute(context.Background(), c.cmd, h)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Calls(); fmt.Sprint(got) != fmt.Sprint(c.wantCalls) {
				t.Errorf("calls: got %q, want %q", got, c.wantCalls)
			}
			if res.Code != c.wantCode || res.Ok != (c.wantCode == "") || res.CommandId != c.cmd.CommandId {
				t.Errorf("result: got %v, want code %q", res, c.wantCode)
			}
		})
	}
}
