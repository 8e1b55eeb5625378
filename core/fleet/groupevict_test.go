// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// managedLocal is a fakeLocal whose relay answers the server's management
// calls (an instance's status, an action) and records which deployments
// they named.
type managedLocal struct {
	*fakeLocal
	mu    sync.Mutex
	named map[string]int
}

func newManagedLocal() *managedLocal {
	return &managedLocal{fakeLocal: newFakeLocal(), named: map[string]int{}}
}

// RelayHandler answers every management call about a deployment: its
// status (one ready instance) or an action (done).
func (l *managedLocal) RelayHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, wire.Prefix+"/deployments/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		name, _, _ := strings.Cut(rest, "/")
		l.mu.Lock()
		l.named[name]++
		l.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(wire.DeploymentStatus{Name: name, State: string(structs.StateReady),
				Instances: []wire.InstanceStatus{{ID: structs.InstanceID(name, 0), State: string(structs.StateReady)}}})
			return
		}
		_ = json.NewEncoder(w).Encode(wire.ActionAccepted{APIVersion: wire.APIVersion, Deployment: name, Done: true})
	})
}

// calls is how many management calls named deployment dep.
func (l *managedLocal) calls(dep string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.named[dep]
}

// TestEvictGroups_OnlyOnTheRefusingHost pins the fleet-trust review's
// L10: a capacity refusal from one host named groups in its way, and the
// server parked them wherever they ran, other hosts' included. Now a
// refusal evicts only the groups with a member on the host that refused.
func TestEvictGroups_OnlyOnTheRefusingHost(t *testing.T) {
	s := testServer(t, ServerOptions{})
	hosts := map[string]*managedLocal{}
	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		hosts[name] = newManagedLocal()
		joinHost(t, s, name, hosts[name])
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

	if !s.evictGroups(context.Background(), "wanted", refusal) {
		t.Fatal("the group with a member on the refusing host was not evicted")
	}
	if n := hosts["gpu-a"].calls("here"); n == 0 {
		t.Fatal("the group in the way on gpu-a was never acted on")
	}
	for _, h := range []string{"gpu-b", "gpu-c"} {
		if n := hosts[h].calls("elsewhere"); n != 0 {
			t.Fatalf("gpu-a's refusal made the server act %d times on %s's group elsewhere, which has no member on gpu-a", n, h)
		}
	}

	// A refusal read from a member's record names no group: the server
	// completes it with the groups on that host (withGroupsOn), which
	// stays a refusal of that host.
	before := hosts["gpu-a"].calls("here")
	recorded := structs.Errf(structs.CodeCapacityBlocked, "host gpu-a: no room on gpu0").WithDetail("host", "gpu-a")
	if !s.evictGroups(context.Background(), "wanted", s.withGroupsOn(recorded, "gpu-a", "wanted")) {
		t.Fatal("a recorded refusal of gpu-a evicted nothing")
	}
	if hosts["gpu-a"].calls("here") == before || hosts["gpu-b"].calls("elsewhere") != 0 {
		t.Fatalf("a recorded refusal of gpu-a acted on here %d times, on elsewhere %d times",
			hosts["gpu-a"].calls("here")-before, hosts["gpu-b"].calls("elsewhere"))
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
