// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// The group code against fakeHosts: no host agent, no engine, no process
// (issue #27 step 7). Each test reads what the hosts were asked, in order.

const groupName = "llama-70b"

// groupSpec is a group on hosts, the head on the first.
func groupSpec(hosts ...string) (*structs.Deployment, json.RawMessage) {
	spec := &structs.Deployment{Name: groupName, Routes: []string{groupName},
		Placement: &structs.PlacementSpec{Hosts: hosts}, Topology: &structs.TopologySpec{TensorParallel: 1, PipelineParallel: len(hosts)}}
	raw := json.RawMessage(`{"name":"` + groupName + `","engine":"vllm","model":"meta-llama/Llama-3.1-70B-Instruct",` +
		`"routes":["` + groupName + `"],"lifecycle":{"warm":true}}`)
	return spec, raw
}

// made lists the members the hosts made from their shares, in order.
func made(f *fakeHosts) []string {
	return f.calls(func(c string) bool { return strings.HasSuffix(c, " make") })
}

// TestCreateGroup_BringUpInRankOrder: a group is made in the order of
// placement.hosts (not the hosts' names), through the desired state: the
// head's share first, admitted by its host's ledger, its rendezvous
// address read from its host's answer, then the worker's share with that
// address; the group is placed once every member is made, and its head
// is ready once every rank started. No host is asked to make a member by
// a management call.
func TestCreateGroup_BringUpInRankOrder(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b")
	s := groupServer(t, f)
	spec, raw := groupSpec("gpu-b", "gpu-a") // the head on gpu-b
	if _, err := s.createGroup(context.Background(), spec, raw, true); err != nil {
		t.Fatal(err)
	}
	if got, want := made(f), []string{"gpu-b make", "gpu-a make"}; !slices.Equal(got, want) {
		t.Fatalf("the members were made in the order %q, want %q (the head's host first)", got, want)
	}
	// The head was started (and admitted) before the worker was made.
	log := f.calls(func(string) bool { return true })
	if h, w := slices.Index(log, "gpu-b start"), slices.Index(log, "gpu-a make"); h < 0 || h > w {
		t.Fatalf("the worker was made before the head started: %q", log)
	}
	if mgmt := f.calls(func(c string) bool { return strings.Contains(c, " POST ") || strings.Contains(c, " DELETE ") }); len(mgmt) > 0 {
		t.Fatalf("members were made or deleted by management calls: %q", mgmt)
	}
	head, work := f.createdAs["gpu-b"], f.createdAs["gpu-a"]
	if head.Rank != 0 || work.Rank != 1 || work.Size != 2 || work.ID != head.ID {
		t.Fatalf("members made as %+v (head) and %+v (worker)", head, work)
	}
	if work.HeadAddress != "gpu-b.lan" || work.RendezvousPort != f.headPort {
		t.Fatalf("the worker was made with the rendezvous %s:%d, want the head's host's gpu-b.lan:%d", work.HeadAddress, work.RendezvousPort, f.headPort)
	}
	p, ok := s.State.Placement(groupName)
	if !ok || p.Group == nil || !slices.Equal(p.Group.Hosts, []string{"gpu-b", "gpu-a"}) || p.Group.HeadAddress != "gpu-b.lan" {
		t.Fatalf("the group's placement is %+v", p)
	}
	if m := f.member("gpu-b", groupName); m.in.State != string(structs.StateReady) {
		t.Fatalf("the head is %s once both ranks started, want ready", m.in.State)
	}
}

// TestGroupStart_ColdStartInRankOrder: a stopped group starts the head
// first, then the worker once the head's host admitted its member, and
// is up when its head is ready.
func TestGroupStart_ColdStartInRankOrder(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b")
	s := groupServer(t, f)
	spec, raw := groupSpec("gpu-b", "gpu-a")
	if _, err := s.createGroup(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	p, _ := s.State.Placement(groupName)
	if err := s.groupStart(context.Background(), p, false, false); err != nil {
		t.Fatal(err)
	}
	starts := f.calls(func(c string) bool { return strings.HasSuffix(c, " start") })
	if want := []string{"gpu-b start", "gpu-a start"}; !slices.Equal(starts, want) {
		t.Fatalf("the members were started in the order %q, want %q", starts, want)
	}
	if m := f.member("gpu-b", groupName); m.in.State != string(structs.StateReady) {
		t.Fatalf("the group's start returned with its head %s", m.in.State)
	}
}

// TestCreateGroup_MemberRefusedTakesTheGroupBack: a member's host whose
// ledger refuses it refuses the deploy, naming the member; the members
// already made are deleted from their hosts (nothing left on any host),
// and nothing is placed.
func TestCreateGroup_MemberRefusedTakesTheGroupBack(t *testing.T) {
	cases := []struct {
		name     string
		refuser  string
		rank     int
		wantMade []string
	}{
		{name: "the worker's host", refuser: "gpu-a", rank: 1, wantMade: []string{"gpu-b make", "gpu-a make"}},
		{name: "the head's host", refuser: "gpu-b", rank: 0, wantMade: []string{"gpu-b make"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHosts("gpu-a", "gpu-b")
			f.refusal[c.refuser] = structs.CodeCapacityBlocked
			s := groupServer(t, f)
			spec, raw := groupSpec("gpu-b", "gpu-a")
			_, err := s.createGroup(context.Background(), spec, raw, true)
			e := structs.AsError(err)
			if e == nil || e.Code != structs.CodeCapacityBlocked || e.Details["host"] != c.refuser || e.Details["rank"] != c.rank {
				t.Fatalf("the deploy answered %v (details %v), want capacity_blocked naming rank %d on %s", err, e.Details, c.rank, c.refuser)
			}
			if got := made(f); !slices.Equal(got, c.wantMade) {
				t.Fatalf("members made: %q, want %q", got, c.wantMade)
			}
			for _, h := range []string{"gpu-a", "gpu-b"} {
				if m := f.member(h, groupName); m != nil {
					t.Fatalf("a member was left on %s (%s) after the deploy was refused", h, m.in.State)
				}
			}
			if _, ok := s.State.Placement(groupName); ok {
				t.Fatal("a refused group was placed")
			}
		})
	}
}

// TestSuperviseGroups_MemberLostStopsTheGroup: a rank whose engine exits
// on its own (a worker or the head) stops the whole group, every member
// on every host, and the group's status says which rank failed and why.
func TestSuperviseGroups_MemberLostStopsTheGroup(t *testing.T) {
	cases := []struct {
		name string
		host string
		rank int
	}{
		{name: "a worker", host: "gpu-a", rank: 1},
		{name: "the head", host: "gpu-b", rank: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHosts("gpu-a", "gpu-b")
			s := groupServer(t, f)
			// Placed, then started by an operator's start (which returns
			// once the head is ready: no bring-up watcher left to see the
			// exit first).
			spec, raw := groupSpec("gpu-b", "gpu-a")
			if _, err := s.createGroup(context.Background(), spec, raw, false); err != nil {
				t.Fatal(err)
			}
			p, _ := s.State.Placement(groupName)
			if err := s.groupStart(context.Background(), p, false, false); err != nil {
				t.Fatal(err)
			}
			f.exit(c.host, groupName, 137)
			poll.Until(t, 10*time.Second, "the group's failure recorded", func() bool { return s.groups.err(groupName) != nil })
			e := s.groups.err(groupName)
			want := "rank " + string(rune('0'+c.rank)) + " on " + c.host + " (the engine exited with code 137)"
			if e.Code != structs.CodeGroupMemberFailed || !strings.Contains(e.Message, want) {
				t.Fatalf("the group's last error is %s %q, want %s naming %q", e.Code, e.Message, structs.CodeGroupMemberFailed, want)
			}
			poll.Until(t, 10*time.Second, "every member stopped", func() bool {
				for _, h := range []string{"gpu-a", "gpu-b"} {
					if m := f.member(h, groupName); m == nil || m.in.State != string(structs.StateStopped) || m.desired != structs.DesiredStopped {
						return false
					}
				}
				return true
			})
		})
	}
}
