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

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// memberShare is a host's member of the group in its share of the
// desired state, and the member's facts its spec carries.
func memberShare(t *testing.T, s *Server, host string) (*hostv1.DesiredDeployment, structs.GroupMember) {
	t.Helper()
	for _, d := range s.desiredFor(host).GetDeployments() {
		if d.GetName() != groupName {
			continue
		}
		var spec struct {
			Instances int                 `json:"instances"`
			Group     structs.GroupMember `json:"group"`
		}
		if err := json.Unmarshal(d.GetSpecJson(), &spec); err != nil || spec.Instances != 1 {
			t.Fatalf("%s's member spec %s (instances %d): %v", host, d.GetSpecJson(), spec.Instances, err)
		}
		return d, spec.Group
	}
	t.Fatalf("host %s's share of the desired state has no member of %s", host, groupName)
	return nil, structs.GroupMember{}
}

// TestGroupShares_MembersAreDesiredState: a group's placement in the
// replicated state carries each member's desired state, and each host's
// share of the desired state carries its member: its rank, the group's
// size and hosts, and for a worker the head's rendezvous address (none
// for the head, whose host picks it). A stop writes every member stopped;
// a host out of reach then is not waited for (the stop answers), and
// stops its member from its share when it links again.
func TestGroupShares_MembersAreDesiredState(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b")
	s := groupServer(t, f)
	spec, raw := groupSpec("gpu-b", "gpu-a")
	if _, err := s.createGroup(context.Background(), spec, raw, true); err != nil {
		t.Fatal(err)
	}
	p, _ := s.State.Placement(groupName)
	if !p.Reconciled() || p.Pending || len(p.Group.Ranks) != 2 {
		t.Fatalf("the group's placement is not desired state: %+v", p.Group)
	}
	for rank, rd := range p.Group.Ranks {
		if rd.Desired != structs.DesiredRunning {
			t.Fatalf("rank %d is desired %q after a deploy with activate, want running", rank, rd.Desired)
		}
	}
	head, hg := memberShare(t, s, "gpu-b")
	worker, wg := memberShare(t, s, "gpu-a")
	if hg.Rank != 0 || hg.Size != 2 || hg.HeadAddress != "" || hg.RendezvousPort != 0 || hg.ID != p.Group.ID || !slices.Equal(hg.Hosts, []string{"gpu-b", "gpu-a"}) {
		t.Fatalf("the head's share says %+v", hg)
	}
	if wg.Rank != 1 || wg.HeadAddress != "gpu-b.lan" || wg.RendezvousPort != f.headPort || wg.ID != p.Group.ID {
		t.Fatalf("the worker's share says %+v, want rank 1 meeting at gpu-b.lan:%d", wg, f.headPort)
	}
	if head.GetDesired() != structs.DesiredRunning || worker.GetDesired() != structs.DesiredRunning {
		t.Fatalf("the shares say %s (head) and %s (worker), want running", head.GetDesired(), worker.GetDesired())
	}

	f.setDown("gpu-a", true)
	if err := s.groupStop(context.Background(), p); err != nil {
		t.Fatalf("a stop with a member's host out of reach: %v", err)
	}
	if m := f.member("gpu-b", groupName); m.in.State != string(structs.StateStopped) {
		t.Fatalf("the head is %s after the stop", m.in.State)
	}
	if d, _ := memberShare(t, s, "gpu-a"); d.GetDesired() != structs.DesiredStopped {
		t.Fatalf("the worker's share says %s after the stop, want stopped", d.GetDesired())
	}
	f.setDown("gpu-a", false)
	if _, err := f.applied(context.Background(), "gpu-a", 0); err != nil { // it links again and reconciles its share
		t.Fatal(err)
	}
	if m := f.member("gpu-a", groupName); m.in.State != string(structs.StateStopped) || m.desired != structs.DesiredStopped {
		t.Fatalf("the worker is %s (desired %s) once its host linked again, want stopped", m.in.State, m.desired)
	}
}

// TestGroupStart_EarlierBuildsGroupRefused: a group placed by an earlier
// build (no spec in its placement: its hosts run its members as their
// own) is refused unsupported with the way out, and nothing is written.
func TestGroupStart_EarlierBuildsGroupRefused(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b")
	s := groupServer(t, f)
	p := &Placement{Deployment: groupName, Routes: []string{groupName}, Revision: 1,
		Hosts: []HostShare{{Host: "gpu-b", Instances: 1}, {Host: "gpu-a", Instances: 1}},
		Group: &GroupPlacement{ID: "g0", Hosts: []string{"gpu-b", "gpu-a"}, TensorParallel: 1, PipelineParallel: 2}}
	if err := s.apply(fsm.Placed{Placement: p}); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"start": s.groupStart(context.Background(), p, false, false),
		"stop":  s.groupStop(context.Background(), p),
		"park":  s.groupPark(context.Background(), p),
	} {
		if e := structs.AsError(err); e == nil || e.Code != structs.CodeUnsupported || !strings.Contains(e.Message, "deploy it again") {
			t.Fatalf("%s of an earlier build's group: %v, want unsupported with the way out", what, err)
		}
	}
	if cur, _ := s.State.Placement(groupName); cur.Version != 1 || len(cur.Group.Ranks) != 0 {
		t.Fatalf("the refused moves wrote the placement: version %d, ranks %+v", cur.Version, cur.Group.Ranks)
	}
}

// TestGroupPark_CommandsInRankOrder: a ready group parks the head first
// (its sleep acts on every rank), then each worker, and wakes the
// workers first, then the head (whose wake answers the wake check): each
// a typed command on the member's host link, never a management call.
func TestGroupPark_CommandsInRankOrder(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b", "gpu-c")
	s := groupServer(t, f)
	spec, raw := groupSpec("gpu-b", "gpu-a", "gpu-c")
	if _, err := s.createGroup(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	p, _ := s.State.Placement(groupName)
	if err := s.groupStart(context.Background(), p, false, false); err != nil {
		t.Fatal(err)
	}
	if err := s.groupPark(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	parks := f.calls(func(c string) bool { return strings.HasSuffix(c, " park") })
	if want := []string{"gpu-b park", "gpu-a park", "gpu-c park"}; !slices.Equal(parks, want) {
		t.Fatalf("the members were parked in the order %q, want %q (the head first)", parks, want)
	}
	for _, h := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		if m := f.member(h, groupName); m.in.State != string(structs.StateParked) {
			t.Fatalf("the member on %s is %s after the park", h, m.in.State)
		}
	}
	if err := s.groupStart(context.Background(), p, false, false); err != nil {
		t.Fatal(err)
	}
	wakes := f.calls(func(c string) bool { return strings.HasSuffix(c, " wake") })
	if want := []string{"gpu-a wake", "gpu-c wake", "gpu-b wake"}; !slices.Equal(wakes, want) {
		t.Fatalf("the members were woken in the order %q, want %q (the workers first, the head last)", wakes, want)
	}
	if m := f.member("gpu-b", groupName); m.in.State != string(structs.StateReady) {
		t.Fatalf("the head is %s after the wake", m.in.State)
	}
	if mgmt := f.calls(func(c string) bool { return strings.Contains(c, " POST ") || strings.Contains(c, " DELETE ") }); len(mgmt) > 0 {
		t.Fatalf("members were moved by management calls: %q", mgmt)
	}
}

// TestGroupBringUp_FailureAndStallStopTheGroup: the bring-up's wait for
// the head reads the members' journals at each change of their hosts: a
// head whose engine exits once the workers start stops the group
// (group_member_failed, naming the rank and host), and a head not ready
// within group_stall_timeout stops it too (group_stalled); every member
// is stopped from its host's share.
func TestGroupBringUp_FailureAndStallStopTheGroup(t *testing.T) {
	for _, c := range []struct {
		name  string
		code  structs.Code
		want  string
		stall time.Duration
	}{
		{name: "the head exits", code: structs.CodeGroupMemberFailed, want: "rank 0 on host gpu-b failed during bring-up", stall: 30 * time.Second},
		{name: "the head stalls", code: structs.CodeGroupStalled, want: "not ready within group_stall_timeout", stall: 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHosts("gpu-a", "gpu-b")
			f.unready, f.headDies = true, c.code == structs.CodeGroupMemberFailed
			s := groupServerWith(t, f, c.stall)
			spec, raw := groupSpec("gpu-b", "gpu-a")
			if _, err := s.createGroup(context.Background(), spec, raw, false); err != nil {
				t.Fatal(err)
			}
			p, _ := s.State.Placement(groupName)
			err := s.groupStart(context.Background(), p, false, false)
			if e := structs.AsError(err); e == nil || e.Code != c.code || !strings.Contains(e.Message, c.want) {
				t.Fatalf("the start answered %v, want %s saying %q", err, c.code, c.want)
			}
			if e := s.groups.err(groupName); e == nil || e.Code != c.code {
				t.Fatalf("the group's last error is %+v, want %s", e, c.code)
			}
			for _, h := range []string{"gpu-a", "gpu-b"} {
				if m := f.member(h, groupName); m.in.State != string(structs.StateStopped) || m.desired != structs.DesiredStopped {
					t.Fatalf("the member on %s is %s (desired %s) after the bring-up failed", h, m.in.State, m.desired)
				}
			}
		})
	}
}

// TestTakeBackPending_AHalfPlacedGroupIsDeleted: a group whose placement
// an earlier leader left pending (its bring-up ended with its leadership)
// is taken back by the next leader: its hosts delete the member they made
// from their shares and its name is free again. A group this server is
// placing now is left to its bring-up.
func TestTakeBackPending_AHalfPlacedGroupIsDeleted(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b")
	s := groupServer(t, f)
	_, raw := groupSpec("gpu-b", "gpu-a")
	p := &Placement{Deployment: groupName, Routes: []string{groupName}, Revision: 1, Spec: raw, Pending: true,
		Hosts: []HostShare{{Host: "gpu-b", Instances: 1}, {Host: "gpu-a", Instances: 1}},
		Group: &GroupPlacement{ID: "g0", Hosts: []string{"gpu-b", "gpu-a"}, TensorParallel: 1, PipelineParallel: 2,
			Ranks: []RankDesired{{Desired: structs.DesiredRunning}, {Desired: structs.DesiredRunning}}}}
	if err := s.apply(fsm.Placed{Placement: p}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.applied(context.Background(), "gpu-b", 0); err != nil { // the head's host made its member
		t.Fatal(err)
	}
	if f.member("gpu-b", groupName) == nil {
		t.Fatal("the head's host did not make the member of its share")
	}
	mine := &Placement{Deployment: "mine", Routes: []string{"mine"}, Revision: 1, Spec: raw, Pending: true,
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}, {Host: "gpu-b", Instances: 1}},
		Group: &GroupPlacement{ID: "g1", Hosts: []string{"gpu-a", "gpu-b"}, TensorParallel: 1, PipelineParallel: 2,
			Ranks: []RankDesired{{Desired: structs.DesiredRunning}, {Desired: structs.DesiredRunning}}}}
	if err := s.apply(fsm.Placed{Placement: mine}); err != nil {
		t.Fatal(err)
	}
	s.groups.setPlacing("g1", true)
	s.takeBackPending(context.Background())
	if _, ok := s.State.Placement("mine"); !ok {
		t.Fatal("a group this server is placing now was taken back")
	}
	if _, ok := s.State.Placement(groupName); ok {
		t.Fatal("the half-placed group is still placed")
	}
	if m := f.member("gpu-b", groupName); m != nil {
		t.Fatalf("the head's member is left on its host (%s)", m.in.State)
	}
	if _, owned := s.State.RouteOwner(groupName); owned {
		t.Fatal("the half-placed group's model name is still claimed")
	}
}
