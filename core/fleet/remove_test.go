// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestRemove_ALostHostTakesItsGroupsAndAdoptedDeployments (M3 of the
// trust review): a host that never comes back, with a deployment it made
// itself (adopted) and a group member on it, can be removed. Its adopted
// deployment and its group are forgotten with the reason journalled, the
// group's member on the other host is deleted there, their model names
// are free again, and the host is revoked. A host that is up keeps them:
// the operator deletes them first.
func TestRemove_ALostHostTakesItsGroupsAndAdoptedDeployments(t *testing.T) {
	s := testServer(t, ServerOptions{})
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()})
	if err != nil {
		t.Fatal(err)
	}
	stopLost := runHost(t, lost)
	other := newFakeLocal()
	joinHost(t, s, "gpu-b", other)
	waitReady(t, s, "gpu-a")
	waitReady(t, s, "gpu-b")
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "mine", Routes: []string{"mine-model"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "grp", Routes: []string{"grp"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}, {Host: "gpu-b", Instances: 1}},
		Spec:  json.RawMessage(`{"name":"grp","engine":"vllm","routes":["grp"]}`),
		Group: &GroupPlacement{ID: "g1", Hosts: []string{"gpu-a", "gpu-b"}, TensorParallel: 2, PipelineParallel: 1,
			Ranks: []RankDesired{{Desired: structs.DesiredRunning}, {Desired: structs.DesiredRunning}}}}}); err != nil {
		t.Fatal(err)
	}

	// Up, the host keeps them.
	if err := s.Remove("gpu-a"); !structs.HasCode(err, structs.CodeConflict) {
		t.Fatalf("remove a host that is up with a group member and an adopted deployment: %v, want conflict", err)
	}

	// Gone for good: its agent stops and never links again.
	stopLost()
	poll.Until(t, 10*time.Second, "gpu-a lost", func() bool { return hostState(s, "gpu-a") == "lost" })
	if err := s.Remove("gpu-a"); err != nil {
		t.Fatalf("remove a lost host: %v", err)
	}
	if _, ok := s.State.Host("gpu-a"); ok {
		t.Fatal("the removed host is still a member")
	}
	if _, revoked := s.State.HostRevoked("gpu-a"); !revoked {
		t.Fatal("the removed host's certificate is not revoked")
	}
	for _, dep := range []string{"mine", "grp"} {
		if _, placed := s.State.Placement(dep); placed {
			t.Fatalf("%s is still placed on the removed host", dep)
		}
	}
	for _, route := range []string{"mine-model", "grp"} {
		if _, owned := s.State.RouteOwner(route); owned {
			t.Fatalf("model name %s is still claimed", route)
		}
	}
	forgotten := map[string]string{}
	evs, err := s.o.Store.EventsAfter(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == "deployment_forgotten" {
			dep, _ := e.Payload["deployment"].(string)
			forgotten[dep], _ = e.Payload["why"].(string)
		}
	}
	if forgotten["mine"] == "" || forgotten["grp"] == "" {
		t.Fatalf("deployment_forgotten events with their reason: %v", forgotten)
	}
	// The other host still serves: placing on it works.
	place(t, s, "after", "gpu-b")
	waitReady(t, s, "gpu-b")
}
