// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
	"github.com/capyctl/capyctl/plugins-testkit/testbin"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
	"github.com/capyctl/capyctl/sdk/proc"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
)

// Plugin serves a built-in driver as a real go-plugin subprocess
// (`capyctl driver <family>`, from the binaries testbin finds or builds)
// and returns its client, killed when the test ends.
func Plugin(t testing.TB, family string) sdk.Driver {
	t.Helper()
	capyctl, _ := testbin.Binaries(t)
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdkplugin.Handshake,
		VersionedPlugins: sdkplugin.VersionedPlugins(nil),
		Cmd:              exec.Command(capyctl, "driver", family),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		StartTimeout:     30 * time.Second,
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("launch driver %s: %v", family, err)
	}
	raw, err := rpc.Dispense(sdkplugin.PluginName)
	if err != nil {
		t.Fatalf("dispense driver: %v", err)
	}
	d, ok := raw.(sdk.Driver)
	if !ok {
		t.Fatalf("the plugin is a %T, not an sdk.Driver", raw)
	}
	return d
}

// GroupRun is a group launched through real driver plugins, one per
// simulated host.
type GroupRun struct {
	// Family is the driver's family.
	Family string
	// Venv is the installation's path (a fake venv).
	Venv string
	// Deployment is the deployment every member runs; its Group is set
	// per member.
	Deployment *sdk.Deployment
	// Size is the number of machines; TP and PP the topology.
	Size, TP, PP int32
	// ParkTier, when set, parks the group at that tier once it answers
	// (the head first, then each worker) and wakes it (the workers first,
	// then the head, whose canary must be its first readiness answer).
	ParkTier string
	// PeerLossHangs says the engine does not notice a lost rank until its
	// next collective (vLLM): a head whose worker is killed stays up, and
	// only a Stop ends it. Otherwise the head exits with an error (SGLang,
	// TensorFold).
	PeerLossHangs bool
}

// GroupMember is one launched member of a GroupRun.
type GroupMember struct {
	Driver sdk.Driver
	Launch *sdk.Launch
	Lctx   *sdk.LaunchContext
}

// probe asks one probe of a member.
func (m *GroupMember) probe(t testing.TB, kind sdk.ProbeKind, deadline time.Duration) *sdk.ProbeResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline+10*time.Second)
	defer cancel()
	p, err := m.Driver.Probe(ctx, &sdk.ProbeRequest{InstanceID: m.Lctx.InstanceID, Kind: kind, Deadline: deadline})
	if err != nil {
		t.Fatalf("probe %v: %v", kind, err)
	}
	return p
}

// Run launches every member of the group, each through a driver plugin of
// its own (as each host's core has its own) with a simulated card of its
// own, head first; it checks that every worker is ready without a canary
// and loads nothing, that the head becomes ready with a canary and answers
// a chat completion; then it kills the last worker and checks that the
// head exits (or, PeerLossHangs, stays up until stopped). It returns the
// members.
func (g GroupRun) Run(t *testing.T) []*GroupMember {
	t.Helper()
	root := t.TempDir()
	rendezvous := FreePort(t)
	var members []*GroupMember
	var inst *sdk.Installation
	for rank := int32(0); rank < g.Size; rank++ {
		d := Plugin(t, g.Family)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if inst == nil {
			det, err := d.Detect(ctx, &sdk.DetectRequest{Path: g.Venv})
			if err != nil {
				t.Fatalf("detect: %v", err)
			}
			inst = &sdk.Installation{Name: g.Family, Family: g.Family, Path: g.Venv, Version: det.Version, Verified: det.Verified,
				Digest: det.Digest, Details: det.Details}
		}
		state := filepath.Join(root, fmt.Sprintf("host%d-gpu.json", rank))
		dev := simgpu.DefaultDevices(1, 8<<30)[0]
		if err := simgpu.Create(state, []simgpu.Device{dev}); err != nil {
			t.Fatal(err)
		}
		host := &sdk.HostPolicy{EngineTelemetry: "off", EngineLogs: "file", Retention: "standard",
			HostEnv: map[string]string{fakeengine.EnvSimState: state}}
		lctx := &sdk.LaunchContext{Port: int32(FreePort(t)), LaunchDir: filepath.Join(root, fmt.Sprintf("host%d", rank), "launches", "0"),
			InstanceID: g.Deployment.Name + "/0", LaunchID: fmt.Sprintf("L%d", rank),
			DeviceUUIDs: []string{dev.UUID}, DeviceTotalBytes: 8 << 30, DeviceBytes: 4 << 30, KVCacheBytes: 1 << 20}
		dep := *g.Deployment // Group is the only field set apart
		dep.Group = Member(rank, g.Size, g.TP, g.PP, int32(rendezvous))
		plan, err := d.Plan(ctx, &sdk.PlanRequest{Installation: *inst, Deployment: dep, Host: *host, Launch: *lctx})
		if err != nil || len(plan.Refusals) > 0 {
			t.Fatalf("rank %d: plan %v %v", rank, err, plan.Refusals)
		}
		resp, err := d.Start(ctx, &sdk.StartRequest{Installation: *inst, Deployment: dep, Host: *host, Launch: *lctx, Plan: *plan,
			EngineKey: "group-test-key", AdminKey: "group-test-admin"})
		if err != nil {
			t.Fatalf("rank %d: start: %v", rank, err)
		}
		pgid := int(resp.Launch.Pgid)
		t.Cleanup(func() {
			if len(proc.GroupPIDs(pgid)) > 0 {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		})
		members = append(members, &GroupMember{Driver: d, Launch: &resp.Launch, Lctx: lctx})
	}

	const ready = 2 * time.Minute
	for _, w := range members[1:] {
		p := w.probe(t, sdk.ProbeKindReadiness, ready)
		if !p.Ready || p.Canary != "" {
			t.Fatalf("worker readiness %v", p)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		load, err := w.Driver.Load(ctx, &sdk.LoadRequest{InstanceID: w.Lctx.InstanceID})
		cancel()
		if err != nil || load.Running != 0 || load.Waiting != 0 {
			t.Fatalf("worker load %v %v", load, err)
		}
	}
	head := members[0]
	p := head.probe(t, sdk.ProbeKindReadiness, ready)
	if !p.Ready || p.Canary == "" {
		t.Fatalf("head readiness %v", p)
	}
	ep := &p.Endpoint
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	answer, err := engineapi.ChatProbe(ctx, engineapi.NewEngineClient(ep.BaseURL, ep.AuthHeader, ep.AuthValue),
		ep.ChatPath, ep.ServedName, "Hello there", 4)
	cancel()
	if err != nil || answer == "" {
		t.Fatalf("chat through the head: %q %v", answer, err)
	}

	if g.ParkTier != "" {
		g.parkAndWake(t, members, p.Canary)
	}

	last := members[len(members)-1]
	if err := syscall.Kill(-int(last.Launch.Pgid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if g.PeerLossHangs {
		// A worker killed: the head does not notice. Its liveness says
		// alive once the worker is proven gone, and the driver's Stop
		// ends it (what CapyCTL's group supervision does).
		poll.Until(t, time.Minute, "the killed worker's exit", func() bool {
			return last.probe(t, sdk.ProbeKindLiveness, time.Second).Exited
		})
		if l := head.probe(t, sdk.ProbeKindLiveness, time.Second); !l.Alive {
			t.Fatalf("the head's liveness after its worker died: %v, want alive (the engine notices at its next collective)", l)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := head.Driver.Stop(ctx, &sdk.StopRequest{InstanceID: head.Lctx.InstanceID, Grace: 5 * time.Second, Launch: head.Launch})
		if err != nil || !st.Gone {
			t.Fatalf("stop the head: %v %v", st, err)
		}
		return members
	}
	// A worker killed: the head exits (the engines' collectives fail).
	poll.Until(t, time.Minute, "the head to exit after its worker was killed", func() bool {
		return !head.probe(t, sdk.ProbeKindLiveness, time.Second).Alive
	})
	l := head.probe(t, sdk.ProbeKindLiveness, time.Second)
	if !l.Exited || l.ExitCode == 0 {
		t.Fatalf("the head's liveness after the worker died: %v (logs:\n%s)", l, strings.Join(l.LastLogLines, "\n"))
	}
	return members
}

// parkAndWake parks the head then the workers, and wakes the workers then
// the head: a worker's park and wake answer at once without a canary; the
// head's wake answers the canary of its first readiness.
func (g GroupRun) parkAndWake(t *testing.T, members []*GroupMember, canary string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, m := range members {
		if _, err := m.Driver.Park(ctx, &sdk.ParkRequest{InstanceID: m.Lctx.InstanceID, Tier: g.ParkTier}); err != nil {
			t.Fatalf("park rank %d: %v", i, err)
		}
	}
	for i := len(members) - 1; i >= 0; i-- {
		m := members[i]
		w, err := m.Driver.Wake(ctx, &sdk.WakeRequest{InstanceID: m.Lctx.InstanceID, Tier: g.ParkTier})
		if err != nil {
			t.Fatalf("wake rank %d: %v", i, err)
		}
		switch {
		case i > 0 && w.Canary != "":
			t.Fatalf("a worker's wake answered a canary: %v", w)
		case i == 0 && w.Canary != canary:
			t.Fatalf("the head's wake canary %q, want %q", w.Canary, canary)
		}
	}
}
