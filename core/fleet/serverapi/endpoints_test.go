// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
)

// The endpoints against a fake server: what each handler asks the hosts,
// which moves it asks of the server, and what it answers.

func TestEndpoints_InstanceAction(t *testing.T) {
	cases := []struct {
		name      string
		path      string
		group     bool
		wantCode  string
		wantCalls []string
		wantIndex float64
	}{
		{name: "the third instance is the second host's first", path: "/deployments/demo/instances/2/actions",
			wantCalls: []string{"b POST /deployments/demo/instances/0/actions"}, wantIndex: 2},
		{name: "the second instance is the first host's second", path: "/deployments/demo/instances/1/actions",
			wantCalls: []string{"a POST /deployments/demo/instances/1/actions"}, wantIndex: 1},
		{name: "past the last instance", path: "/deployments/demo/instances/3/actions", wantCode: "not_found"},
		{name: "not an index", path: "/deployments/demo/instances/x/actions", wantCode: "invalid_request"},
		{name: "a group's members move together", path: "/deployments/demo/instances/0/actions", group: true, wantCode: "unsupported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := adopted("demo", fsm.HostShare{Host: "a", Instances: 2}, fsm.HostShare{Host: "b", Instances: 1})
			if c.group {
				p.Group = &fsm.GroupPlacement{}
			}
			f := &fakeServer{placements: map[string]*fsm.Placement{"demo": p}, inReach: map[string]bool{"a": true, "b": true},
				answer: func(host, method, path string, body []byte) (int, []byte) {
					// The host answers with its own index.
					i := strings.Split(path, "/")[4]
					return http.StatusAccepted, []byte(`{"deployment":"demo","action":"stop","instance":` + i + `}`)
				}}
			w := serve(t, f, http.MethodPost, wire.Prefix+c.path, `{"action":"stop"}`)
			if got := errorCode(t, w); got != c.wantCode {
				t.Fatalf("code %q (%d %s), want %q", got, w.Code, w.Body, c.wantCode)
			}
			if !slices.Equal(f.calls, c.wantCalls) {
				t.Fatalf("host calls %q, want %q", f.calls, c.wantCalls)
			}
			if c.wantCode != "" {
				return
			}
			var ans map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &ans); err != nil || w.Code != http.StatusAccepted {
				t.Fatalf("answer %d %s: %v", w.Code, w.Body, err)
			}
			if ans["instance"] != c.wantIndex {
				t.Fatalf("answer names instance %v, want the deployment-wide %v", ans["instance"], c.wantIndex)
			}
		})
	}
}

func TestEndpoints_DeleteDeployment(t *testing.T) {
	managed := adopted("demo", fsm.HostShare{Host: "a", Instances: 1})
	managed.Spec = json.RawMessage(`{"name":"demo"}`)
	group := adopted("demo", fsm.HostShare{Host: "a", Instances: 1}, fsm.HostShare{Host: "b", Instances: 1})
	group.Group = &fsm.GroupPlacement{}
	cases := []struct {
		name      string
		p         *fsm.Placement
		inReach   map[string]bool
		wantCode  string
		wantCalls []string
		wantMoves []string
	}{
		{name: "a placed deployment is the server's to delete", p: managed, inReach: map[string]bool{},
			wantMoves: []string{"delete demo", "forget demo"}},
		{name: "an adopted one is deleted on each host, then forgotten",
			p:         adopted("demo", fsm.HostShare{Host: "a", Instances: 1}, fsm.HostShare{Host: "b", Instances: 1}),
			inReach:   map[string]bool{"a": true, "b": true},
			wantCalls: []string{"a DELETE /deployments/demo", "b DELETE /deployments/demo"},
			wantMoves: []string{"unplace demo", "forget demo"}},
		{name: "an adopted one stays while a host of it is out of reach",
			p:       adopted("demo", fsm.HostShare{Host: "a", Instances: 1}, fsm.HostShare{Host: "b", Instances: 1}),
			inReach: map[string]bool{"a": true}, wantCode: "host_unreachable"},
		{name: "a group stops every rank first", p: group, inReach: map[string]bool{"a": true, "b": true},
			wantMoves: []string{"delete-group demo", "forget demo"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeServer{placements: map[string]*fsm.Placement{"demo": c.p}, inReach: c.inReach,
				answer: func(host, method, path string, body []byte) (int, []byte) { return http.StatusNoContent, nil }}
			w := serve(t, f, http.MethodDelete, wire.Prefix+"/deployments/demo", "")
			if got := errorCode(t, w); got != c.wantCode {
				t.Fatalf("code %q (%d %s), want %q", got, w.Code, w.Body, c.wantCode)
			}
			if !slices.Equal(f.calls, c.wantCalls) || !slices.Equal(f.moves, c.wantMoves) {
				t.Fatalf("host calls %q and moves %q, want %q and %q", f.calls, f.moves, c.wantCalls, c.wantMoves)
			}
		})
	}
}

func TestEndpoints_UpdateAdopted(t *testing.T) {
	cases := []struct {
		name      string
		body      string
		wantCode  string
		wantPuts  map[string]float64 // host -> the instances its share names
		wantMoves []string
	}{
		{name: "each host gets its share of the instances", body: `{"deployment":{"name":"demo","instances":3},"expected_revision":1}`,
			wantPuts: map[string]float64{"a": 2, "b": 1}, wantMoves: []string{"replace demo@2"}},
		{name: "a new spread is refused", body: `{"deployment":{"name":"demo","instances":4}}`, wantCode: "unsupported"},
		{name: "a stale revision is refused before any host changes", body: `{"deployment":{"name":"demo"},"expected_revision":7}`,
			wantCode: "revision_conflict"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			puts := map[string]float64{}
			f := &fakeServer{
				placements: map[string]*fsm.Placement{"demo": adopted("demo", fsm.HostShare{Host: "a", Instances: 2}, fsm.HostShare{Host: "b", Instances: 1})},
				inReach:    map[string]bool{"a": true, "b": true},
				statuses:   map[string]wire.DeploymentStatus{"demo": {Name: "demo", Revision: 2}},
				answer: func(host, method, path string, body []byte) (int, []byte) {
					if method == http.MethodGet {
						return http.StatusOK, []byte(`{"name":"demo","revision":1}`)
					}
					var req struct {
						Deployment map[string]any `json:"deployment"`
					}
					_ = json.Unmarshal(body, &req)
					mu.Lock()
					puts[host], _ = req.Deployment["instances"].(float64)
					mu.Unlock()
					return http.StatusOK, []byte(`{"name":"demo","revision":2}`)
				}}
			w := serve(t, f, http.MethodPut, wire.Prefix+"/deployments/demo", c.body)
			if got := errorCode(t, w); got != c.wantCode {
				t.Fatalf("code %q (%d %s), want %q", got, w.Code, w.Body, c.wantCode)
			}
			if len(puts) != len(c.wantPuts) {
				t.Fatalf("updates %v, want %v", puts, c.wantPuts)
			}
			for h, n := range c.wantPuts {
				if puts[h] != n {
					t.Fatalf("host %s's update names %v instances, want %v (all: %v)", h, puts[h], n, puts)
				}
			}
			if !slices.Equal(f.moves, c.wantMoves) {
				t.Fatalf("moves %q, want %q", f.moves, c.wantMoves)
			}
		})
	}
}

// TestEndpoints_ChangeDeployment: a change goes where the placement's
// kind says: a placed deployment's to the server's moves (decoded), a
// group's to the group's own, an adopted one's to its hosts.
func TestEndpoints_ChangeDeployment(t *testing.T) {
	placed := adopted("demo", fsm.HostShare{Host: "a", Instances: 1})
	placed.Spec = json.RawMessage(`{"name":"demo"}`)
	group := adopted("demo", fsm.HostShare{Host: "a", Instances: 1}, fsm.HostShare{Host: "b", Instances: 1})
	group.Group = &fsm.GroupPlacement{}
	cases := []struct {
		name      string
		p         *fsm.Placement
		method    string
		path      string
		body      string
		wantCode  string
		wantCalls []string
		wantMoves []string
	}{
		{name: "a placed deployment's update", p: placed, method: http.MethodPut, path: "/deployments/demo",
			body:      `{"deployment":{"name":"demo"},"expected_revision":3,"activate":true}`,
			wantMoves: []string{`update demo expected=3 activate=true spec={"name":"demo"}`}},
		{name: "a placed deployment's action", p: placed, method: http.MethodPost, path: "/deployments/demo/actions",
			body: `{"action":"start","wait":true,"evict":true}`, wantMoves: []string{"start demo wait=true evict=true"}},
		{name: "a placed deployment's update needs a deployment", p: placed, method: http.MethodPut, path: "/deployments/demo",
			body: `{"expected_revision":3}`, wantCode: "invalid_request"},
		{name: "a group's update is the group's", p: group, method: http.MethodPut, path: "/deployments/demo",
			body: `{"deployment":{"name":"demo"}}`, wantMoves: []string{`group PUT demo {"deployment":{"name":"demo"}}`}},
		{name: "a group's action is the group's", p: group, method: http.MethodPost, path: "/deployments/demo/actions",
			body: `{"action":"park"}`, wantMoves: []string{`group POST demo {"action":"park"}`}},
		{name: "an adopted deployment's action goes to each host", p: adopted("demo", fsm.HostShare{Host: "a", Instances: 1}, fsm.HostShare{Host: "b", Instances: 1}),
			method: http.MethodPost, path: "/deployments/demo/actions", body: `{"action":"stop"}`,
			wantCalls: []string{"a POST /deployments/demo/actions", "b POST /deployments/demo/actions"}},
		{name: "no such deployment", p: placed, method: http.MethodPost, path: "/deployments/other/actions", body: `{"action":"stop"}`,
			wantCode: "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeServer{placements: map[string]*fsm.Placement{"demo": c.p}, inReach: map[string]bool{"a": true, "b": true},
				answer: func(host, method, path string, body []byte) (int, []byte) {
					return http.StatusOK, []byte(`{"deployment":"demo","action":"stop","done":true}`)
				}}
			w := serve(t, f, c.method, wire.Prefix+c.path, c.body)
			if got := errorCode(t, w); got != c.wantCode {
				t.Fatalf("code %q (%d %s), want %q", got, w.Code, w.Body, c.wantCode)
			}
			if !slices.Equal(f.calls, c.wantCalls) || !slices.Equal(f.moves, c.wantMoves) {
				t.Fatalf("host calls %q and moves %q, want %q and %q", f.calls, f.moves, c.wantCalls, c.wantMoves)
			}
		})
	}
}

func TestEndpoints_CreateExisting(t *testing.T) {
	f := &fakeServer{placements: map[string]*fsm.Placement{"demo": adopted("demo", fsm.HostShare{Host: "a", Instances: 1})}}
	body := `{"deployment":{"name":"demo","engine":"fake","model":{"path":"/m"}}}`
	w := serve(t, f, http.MethodPost, wire.Prefix+"/deployments", body)
	if got := errorCode(t, w); got != "conflict" {
		t.Fatalf("code %q (%d %s), want conflict", got, w.Code, w.Body)
	}
}

func TestEndpoints_LoadView(t *testing.T) {
	hostView := func(ids ...string) []byte {
		dl := wire.DeploymentLoad{Deployment: "demo", Requests: wire.RequestCounts{Places: 4, Waiting: 1, InFlight: 2}, Engines: map[string]wire.EngineLoad{}}
		for _, id := range ids {
			dl.Requests.Instances = append(dl.Requests.Instances, wire.InstanceRequestCounts{ID: id, InFlight: 1})
			dl.Engines[id] = wire.EngineLoad{}
		}
		data, _ := json.Marshal(wire.LoadResponse{Deployments: []wire.DeploymentLoad{dl}})
		return data
	}
	f := &fakeServer{
		placements: map[string]*fsm.Placement{"demo": adopted("demo", fsm.HostShare{Host: "a", Instances: 2}, fsm.HostShare{Host: "b", Instances: 1})},
		inReach:    map[string]bool{"a": true, "b": true},
		answer: func(host, method, path string, body []byte) (int, []byte) {
			if host == "a" {
				return http.StatusOK, hostView("demo/0", "demo/1")
			}
			return http.StatusOK, hostView("demo/0")
		}}
	w := serve(t, f, http.MethodGet, wire.Prefix+"/metrics/load", "")
	var out wire.LoadResponse
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || len(out.Deployments) != 1 {
		t.Fatalf("load view %d %s: %v", w.Code, w.Body, err)
	}
	dl := out.Deployments[0]
	if dl.Requests.Waiting != 2 || dl.Requests.InFlight != 4 || dl.Requests.Places != 4 {
		t.Fatalf("counts %+v, want the hosts' summed (waiting 2, in flight 4) and one host's places (4)", dl.Requests)
	}
	var ids []string
	for _, ic := range dl.Requests.Instances {
		ids = append(ids, ic.ID)
	}
	if want := []string{"demo/0", "demo/1", "demo/2"}; !slices.Equal(ids, want) {
		t.Fatalf("instances %q, want numbered deployment-wide %q", ids, want)
	}
	if _, ok := dl.Engines["demo/2"]; !ok || len(dl.Engines) != 3 {
		t.Fatalf("engines %v, want demo/0..demo/2", dl.Engines)
	}
}

func TestEndpoints_Metrics(t *testing.T) {
	f := &fakeServer{inReach: map[string]bool{"a": true, "b": true},
		metrics: map[string]string{"a": "# HELP up up\nup 1\nreq_total{model=\"m\"} 3\n"}}
	w := serve(t, f, http.MethodGet, "/metrics", "")
	want := "capyctl_server_up 1\nup{host=\"a\"} 1\nreq_total{host=\"a\",model=\"m\"} 3\n"
	if w.Body.String() != want {
		t.Fatalf("metrics:\n%s\nwant:\n%s", w.Body, want)
	}
}

func TestEndpoints_RemoveEngineOfTheHosts(t *testing.T) {
	f := &fakeServer{inReach: map[string]bool{"a": true, "b": true},
		answer: func(host, method, path string, body []byte) (int, []byte) {
			return http.StatusOK, []byte(`{"removed":"x"}`)
		}}
	f.Server = removeOnly{}
	w := serve(t, f, http.MethodDelete, wire.Prefix+"/engines/x", "")
	if want := []string{"a DELETE /engines/x", "b DELETE /engines/x"}; w.Code != http.StatusOK || !slices.Equal(f.calls, want) {
		t.Fatalf("answer %d %s, host calls %q, want 200 and %q", w.Code, w.Body, f.calls, want)
	}
}

// removeOnly is a server whose cluster registered no engine: a removal
// is the hosts' own.
type removeOnly struct{ Server }

func (removeOnly) RemoveEngine(context.Context, string) (bool, error) { return false, nil }
