// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// revisionRaw is the group groupSpec places (head on gpu-b, worker on
// gpu-a) as a client sends it, with a model path of its own.
func revisionRaw(model string, hosts ...string) json.RawMessage {
	hs, _ := json.Marshal(hosts)
	return json.RawMessage(fmt.Sprintf(`{"name":%q,"engine":"vllm","model":{"path":%q},"routes":[%q],`+
		`"placement":{"hosts":%s},"topology":{"tensor_parallel":1,"pipeline_parallel":%d}}`, groupName, model, groupName, hs, len(hosts)))
}

// placeRevisionGroup places the group at revision 1 on gpu-b (head) and
// gpu-a, started (ready) with start.
func placeRevisionGroup(t *testing.T, f *fakeHosts, s *Server, start bool) {
	t.Helper()
	raw := revisionRaw("old", "gpu-b", "gpu-a")
	spec, err := specOf(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.createGroup(context.Background(), spec, raw, start); err != nil {
		t.Fatal(err)
	}
	if start {
		waitHead(t, f, structs.StateReady)
	}
}

func waitHead(t *testing.T, f *fakeHosts, want structs.InstanceState) {
	t.Helper()
	if m := f.member("gpu-b", groupName); m == nil || m.in.State != string(want) {
		t.Fatalf("the head is %+v, want %s", m, want)
	}
}

// since returns what the hosts did after the first n calls (their
// reads left out).
func since(f *fakeHosts, n int) []string {
	var out []string
	for _, c := range f.calls(func(string) bool { return true })[n:] {
		if !strings.Contains(c, " GET ") {
			out = append(out, c)
		}
	}
	return out
}

// TestGroupRevision_RestartsWholeOnTheNewSpec: a started group's new
// revision stops every rank of the old one, then each host makes its
// member of the new spec, then the group starts as a cold start does
// (the head, admitted, then the worker) and answers ready at the new
// revision; a group never started stays on demand, nothing started; the
// same spec changes nothing (with activate, a group not up starts as any
// start does, at the same revision).
func TestGroupRevision_RestartsWholeOnTheNewSpec(t *testing.T) {
	cases := []struct {
		name     string
		start    bool // the group was started before its new revision
		activate bool // the PUT says activate
		model    string
		want     []string // what the hosts did, in order (a "|" joins steps done at once, in any order)
		wantRev  uint64
		state    structs.InstanceState // the head's once answered
	}{
		{name: "started", start: true, model: "new",
			want:    []string{"gpu-b stop|gpu-a stop", "gpu-b revise", "gpu-a revise", "gpu-b start", "gpu-a start"},
			wantRev: 2, state: structs.StateReady},
		{name: "never started", model: "new", want: []string{"gpu-b revise", "gpu-a revise"}, wantRev: 2, state: structs.StateStopped},
		{name: "the same spec", start: true, model: "old", wantRev: 1, state: structs.StateReady},
		{name: "the same spec, activated", model: "old", activate: true, want: []string{"gpu-b stop|gpu-a stop", "gpu-b start", "gpu-a start"},
			wantRev: 1, state: structs.StateReady},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHosts("gpu-a", "gpu-b")
			s := groupServer(t, f)
			placeRevisionGroup(t, f, s, c.start)
			n := len(f.calls(func(string) bool { return true }))
			st, err := s.reviseGroup(context.Background(), groupName, revisionRaw(c.model, "gpu-b", "gpu-a"), 1, c.activate)
			if err != nil {
				t.Fatal(err)
			}
			got := since(f, n)
			if !sameSteps(got, c.want) {
				t.Fatalf("the hosts did %q, want %q", got, c.want)
			}
			if st.Revision != c.wantRev {
				t.Fatalf("answered revision %d, want %d", st.Revision, c.wantRev)
			}
			p, _ := s.State.Placement(groupName)
			if p.Revision != c.wantRev || !strings.Contains(string(p.Spec), `"path":"`+c.model+`"`) {
				t.Fatalf("placed revision %d with spec %s", p.Revision, p.Spec)
			}
			for _, h := range []string{"gpu-b", "gpu-a"} {
				if m := f.member(h, groupName); m.revision != c.wantRev || !strings.Contains(m.model, c.model) {
					t.Fatalf("%s runs revision %d of model %s", h, m.revision, m.model)
				}
			}
			waitHead(t, f, c.state)
			if !c.start && !c.activate {
				if d := p.Group.Ranks[0].Desired; d != structs.DesiredOnDemand {
					t.Fatalf("a group never started is %s at its new revision, want on_demand", d)
				}
			}
		})
	}
}

// sameSteps reports whether got is want, where a want step "a|b" is
// those calls in any order.
func sameSteps(got, want []string) bool {
	var flat []string
	for _, w := range want {
		parts := strings.Split(w, "|")
		if len(got) < len(flat)+len(parts) {
			return false
		}
		seen := append([]string(nil), got[len(flat):len(flat)+len(parts)]...)
		slices.Sort(seen)
		slices.Sort(parts)
		if !slices.Equal(seen, parts) {
			return false
		}
		flat = append(flat, parts...)
	}
	return len(got) == len(flat)
}

// TestGroupRevision_RefusedKeepsTheOldRevision: a new revision a member's
// host cannot make, or whose member its ledger refuses, is refused with
// that host's code naming the member; the old revision is written back
// (placed, made again on each host) and, started before, runs again.
// Refusals the server makes itself come before anything stops.
func TestGroupRevision_RefusedKeepsTheOldRevision(t *testing.T) {
	cases := []struct {
		name     string
		hosts    []string
		expected uint64
		refuse   func(f *fakeHosts)
		code     structs.Code
		msg      string
		stops    bool // the old revision was stopped before the refusal
	}{
		{name: "the worker's host refuses the spec", hosts: []string{"gpu-b", "gpu-a"},
			refuse: func(f *fakeHosts) { f.rejectModel[`gpu-a {"path":"new"}`] = structs.CodeCapabilityMissing },
			code:   structs.CodeCapabilityMissing, msg: "rank 1 on host gpu-a", stops: true},
		{name: "a ledger refuses it", hosts: []string{"gpu-b", "gpu-a"},
			refuse: func(f *fakeHosts) { f.refuseModel[`{"path":"new"}`] = structs.CodeCapacityBlocked },
			code:   structs.CodeCapacityBlocked, msg: "rank 0 on host gpu-b", stops: true},
		{name: "other hosts", hosts: []string{"gpu-a", "gpu-b"}, code: structs.CodeUnsupported, msg: "keeps its hosts"},
		{name: "a stale revision", hosts: []string{"gpu-b", "gpu-a"}, expected: 7, code: structs.CodeRevisionConflict, msg: "not 7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHosts("gpu-a", "gpu-b")
			s := groupServer(t, f)
			placeRevisionGroup(t, f, s, true)
			if c.refuse != nil {
				c.refuse(f)
			}
			n := len(f.calls(func(string) bool { return true }))
			_, err := s.reviseGroup(context.Background(), groupName, revisionRaw("new", c.hosts...), c.expected, false)
			e := structs.AsError(err)
			if err == nil || e.Code != c.code || !strings.Contains(e.Message, c.msg) {
				t.Fatalf("the new revision answered %v, want %s naming %q", err, c.code, c.msg)
			}
			p, _ := s.State.Placement(groupName)
			if p.Revision != 1 || !strings.Contains(string(p.Spec), `"path":"old"`) || p.Group.Ranks[0].Desired != structs.DesiredRunning {
				t.Fatalf("after the refusal (%v) the group is placed at revision %d (%s), head desired %s", err, p.Revision, p.Spec, p.Group.Ranks[0].Desired)
			}
			for _, h := range []string{"gpu-b", "gpu-a"} {
				if m := f.member(h, groupName); m == nil || !strings.Contains(m.model, "old") {
					t.Fatalf("after the refusal %s runs %+v, want the old model", h, m)
				}
			}
			waitHead(t, f, structs.StateReady)
			if stopped := slices.Contains(since(f, n), "gpu-b stop"); stopped != c.stops {
				t.Fatalf("the old revision stopped: %v, want %v (%q)", stopped, c.stops, since(f, n))
			}
			if c.stops && !strings.Contains(e.Message, "the old revision runs again") {
				t.Fatalf("the refusal does not say the old revision runs again: %s", e.Message)
			}
		})
	}
}
