// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// TestEvictGroups_OnlyOnTheRefusingHost pins the fleet-trust review's
// L10: a capacity refusal from one host named groups in its way, and the
// server parked them wherever they ran, other hosts' included. Now a
// refusal evicts only the groups with a member on the host that refused.
func TestEvictGroups_OnlyOnTheRefusingHost(t *testing.T) {
	s := testServer(t, ServerOptions{})
	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		joinHost(t, s, name, newFakeLocal())
		waitReady(t, s, name)
	}
	group := func(name string, on ...string) {
		p := &Placement{Deployment: name, Routes: []string{name}, Revision: 1, At: time.Now().UTC(),
			Spec:  json.RawMessage(`{"name":"` + name + `","engine":"vllm","routes":["` + name + `"]}`),
			Group: &GroupPlacement{ID: name + "-1", Hosts: on, TensorParallel: len(on), PipelineParallel: 1}}
		for _, h := range on {
			p.Hosts = append(p.Hosts, HostShare{Host: h, Instances: 1})
			p.Group.Ranks = append(p.Group.Ranks, RankDesired{Desired: structs.DesiredRunning})
		}
		if err := s.apply(fsm.Placed{Placement: p}); err != nil {
			t.Fatal(err)
		}
	}
	group("elsewhere", "gpu-b", "gpu-c") // no member on gpu-a
	group("here", "gpu-a", "gpu-c")

	// gpu-a refuses a start for lack of room and names both groups.
	body, _ := json.Marshal(wire.ErrorEnvelope{Error: wire.ErrorBody{Code: string(structs.CodeCapacityBlocked), Message: "no room on gpu0",
		Details: map[string]any{"evictable_groups": []string{"elsewhere", "here"}, "host": "gpu-b"}}})
	refusal := hostError("gpu-a", http.StatusConflict, body)

	// The groups read stopped (their hosts journal no member), so an
	// eviction stops them: each one's ranks are written stopped.
	desired := func(name string) string {
		p, _ := s.State.Placement(name)
		return p.Group.Ranks[0].Desired
	}
	if !s.evictGroups(context.Background(), "wanted", refusal) {
		t.Fatal("the group with a member on the refusing host was not evicted")
	}
	if d := desired("here"); d != structs.DesiredStopped {
		t.Fatalf("the group in the way on gpu-a was never acted on (desired %s)", d)
	}
	if d := desired("elsewhere"); d != structs.DesiredRunning {
		t.Fatalf("gpu-a's refusal made the server act on group elsewhere, which has no member on gpu-a (desired %s)", d)
	}

	// A refusal read from a member's record names no group: the server
	// completes it with the groups on that host (withGroupsOn), which
	// stays a refusal of that host.
	group("here", "gpu-a", "gpu-c")
	recorded := structs.Errf(structs.CodeCapacityBlocked, "host gpu-a: no room on gpu0").WithDetail("host", "gpu-a")
	if !s.evictGroups(context.Background(), "wanted", s.withGroupsOn(recorded, "gpu-a", "wanted")) {
		t.Fatal("a recorded refusal of gpu-a evicted nothing")
	}
	if here, elsewhere := desired("here"), desired("elsewhere"); here != structs.DesiredStopped || elsewhere != structs.DesiredRunning {
		t.Fatalf("a recorded refusal of gpu-a left here %s, elsewhere %s", here, elsewhere)
	}
}

// namedGroup is a group named name on hosts (the head on the first), as
// a client sends it.
func namedGroup(t *testing.T, name string, hosts ...string) (*structs.Deployment, json.RawMessage) {
	t.Helper()
	hs, _ := json.Marshal(hosts)
	raw := json.RawMessage(`{"name":"` + name + `","engine":"vllm","model":{"path":"` + name + `"},"routes":["` + name + `"],` +
		`"placement":{"hosts":` + string(hs) + `},"topology":{"tensor_parallel":1,"pipeline_parallel":2}}`)
	spec, err := specOf(raw)
	if err != nil {
		t.Fatal(err)
	}
	return spec, raw
}

// TestEvictGroups_NeverStopsAParkedGroup: a start refused for room on a
// host parks a ready group in the way there; a group in the way that is
// parked already is left parked (its residue is what its hosts' ledgers
// charged for its park; a refusal that follows that park at once may
// predate the host crediting it), and nothing counts as freed.
func TestEvictGroups_NeverStopsAParkedGroup(t *testing.T) {
	cases := []struct {
		name   string
		parked bool // the group in the way is parked before the refusal
		freed  bool
	}{
		{name: "a ready group is parked", freed: true},
		{name: "a parked group stays parked", parked: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHosts("gpu-a", "gpu-b")
			s := groupServer(t, f)
			spec, raw := namedGroup(t, "two", "gpu-a", "gpu-b")
			if _, err := s.createGroup(context.Background(), spec, raw, true); err != nil {
				t.Fatal(err)
			}
			p, _ := s.State.Placement("two")
			if c.parked {
				if err := s.groupPark(context.Background(), p); err != nil {
					t.Fatal(err)
				}
			}
			refusal := structs.Errf(structs.CodeCapacityBlocked, "host gpu-a: no room on gpu0 for the member").
				WithDetail("host", "gpu-a").WithDetail("evictable_groups", []string{"two"})
			if freed := s.evictGroups(context.Background(), "one", refusal); freed != c.freed {
				t.Fatalf("evictGroups freed %v, want %v", freed, c.freed)
			}
			for _, h := range []string{"gpu-a", "gpu-b"} {
				if m := f.member(h, "two"); m.in.State != string(structs.StateParked) {
					t.Fatalf("the group in the way is %s on %s, want parked", m.in.State, h)
				}
			}
			if p, _ := s.State.Placement("two"); p.Group.Ranks[0].Desired != structs.DesiredRunning {
				t.Fatalf("the group in the way is desired %s, want running (parked, not stopped)", p.Group.Ranks[0].Desired)
			}
		})
	}
}

// TestGroupMembers_ReadFromJournals: a group's start, park, wake, new
// revision, eviction and stop decide from the journals its hosts pushed
// (each host sends an answer only after the journals of what it did
// before it), never from a management call over the relay.
func TestGroupMembers_ReadFromJournals(t *testing.T) {
	f := newFakeHosts("gpu-a", "gpu-b")
	s := groupServer(t, f)
	spec, raw := namedGroup(t, "two", "gpu-a", "gpu-b")
	if _, err := s.createGroup(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, _ := s.State.Placement("two")
	steps := []struct {
		name string
		do   func() error
		head structs.InstanceState
	}{
		{"cold start", func() error { return s.groupStart(ctx, p, false, false) }, structs.StateReady},
		{"park", func() error { return s.groupPark(ctx, p) }, structs.StateParked},
		{"wake", func() error { return s.groupStart(ctx, p, false, false) }, structs.StateReady},
		{"new revision", func() error {
			_, err := s.reviseGroup(ctx, "two", json.RawMessage(strings.Replace(string(raw), `"path":"two"`, `"path":"two-2"`, 1)), 0, false)
			return err
		}, structs.StateReady},
		{"evicted", func() error {
			refusal := structs.Errf(structs.CodeCapacityBlocked, "host gpu-a: no room").WithDetail("host", "gpu-a").WithDetail("evictable_groups", []string{"two"})
			if !s.evictGroups(ctx, "one", refusal) {
				return structs.Errf(structs.CodeInternal, "nothing evicted")
			}
			return nil
		}, structs.StateParked},
		{"stop", func() error { p, _ = s.State.Placement("two"); return s.groupStop(ctx, p) }, structs.StateStopped},
	}
	for _, st := range steps {
		n := len(f.calls(func(string) bool { return true }))
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if m := f.member("gpu-a", "two"); m.in.State != string(st.head) {
			t.Fatalf("after %s the head is %s, want %s", st.name, m.in.State, st.head)
		}
		did := f.calls(func(string) bool { return true })[n:]
		// A new revision answers the group's status (each host's full
		// view of its member, over the relay): those reads come last.
		for len(did) > 0 && strings.Contains(did[len(did)-1], " GET ") && st.name == "new revision" {
			did = did[:len(did)-1]
		}
		for _, c := range did {
			if strings.Contains(c, " GET ") {
				t.Fatalf("%s read members over the relay: %q", st.name, did)
			}
		}
	}
}
