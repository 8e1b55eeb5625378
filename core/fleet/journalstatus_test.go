// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// statusLocal is a host whose management API answers one deployment's
// status (answer, as the test sets it) and counts the asks; its journals
// are the test's.
type statusLocal struct {
	*fakeLocal
	asked  atomic.Int64
	answer atomic.Pointer[wire.DeploymentStatus]
}

func (l *statusLocal) RelayHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != wire.Prefix+"/deployments/demo" {
			http.NotFound(w, r)
			return
		}
		l.asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(l.answer.Load())
	})
}

// journal makes the host hold demo/0 in state at since (with its status,
// or without one as a host of an older version sends it), and waits until
// the server has it.
func (l *statusLocal) journal(t *testing.T, s *Server, state string, since time.Time, withStatus bool) {
	t.Helper()
	j := &hostv1.InstanceJournal{InstanceId: "demo/0", Generation: 1, Deployment: "demo", State: state, SinceUnixMs: since.UnixMilli(),
		Revision: 1, Placed: true}
	if withStatus {
		j.StatusJson, _ = json.Marshal(wire.InstanceStatus{ID: "demo/0", State: state, Since: since, Revision: 1, Generation: 1, PID: 4242})
	}
	l.mu.Lock()
	l.journals = []*hostv1.InstanceJournal{j}
	l.mu.Unlock()
	l.changes.publish()
	poll.Until(t, 10*time.Second, "the server has demo/0's journal "+state, func() bool {
		got := s.hostIO.journal("gpu-a", "demo/0")
		return got != nil && got.GetState() == state && (len(got.GetStatusJson()) > 0) == withStatus
	})
}

func (l *statusLocal) says(state string, since time.Time) {
	l.answer.Store(&wire.DeploymentStatus{Name: "demo", Engine: "vllm", Revision: 1,
		Instances: []wire.InstanceStatus{{ID: "demo/0", State: state, Since: since, Revision: 1, Generation: 1}}})
}

// TestDeploymentStatus_FromJournals: a placed deployment's status shows
// its instances as the host's journals pushed them, without asking the
// host each read (a deploy --wait polls it every few milliseconds; each
// ask was a management call over the relay); the host is asked for what
// no journal carries at most once per statusFresh, and each time for a
// host whose journals carry no status. An instance shown from an answer
// that was ahead of the journals stays until a journal passes it: a
// status never goes back.
func TestDeploymentStatus_FromJournals(t *testing.T) {
	s := testServer(t, ServerOptions{})
	s.statusAsks.fresh.Store(int64(time.Hour))
	local := &statusLocal{fakeLocal: newFakeLocal()}
	t0 := time.Now().Add(-time.Minute)
	local.says("starting", t0)
	joinHost(t, s, "gpu-a", local)
	waitReady(t, s, "gpu-a")
	raw := json.RawMessage(`{"name":"demo","engine":"vllm","model":{"path":"demo"},"routes":["demo"]}`)
	spec, err := api.SpecFromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.createPlaced(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	p, _ := s.State.Placement("demo")
	read := func() wire.InstanceStatus {
		t.Helper()
		st := s.deploymentStatus(context.Background(), p)
		if len(st.Instances) != 1 {
			t.Fatalf("status has %d instances, want 1: %+v", len(st.Instances), st)
		}
		return st.Instances[0]
	}

	// The host's answer stays "starting"; its journal says ready.
	local.journal(t, s, "starting", t0, true)
	_ = read()
	asked := local.asked.Load()
	local.journal(t, s, "ready", t0.Add(time.Second), true)
	for i := 0; i < 5; i++ {
		if in := read(); in.State != "ready" || in.PID != 4242 || in.Host != "gpu-a" || in.ID != "demo/0" {
			t.Fatalf("read %d: %+v, want demo/0 ready on gpu-a as its journal says", i, in)
		}
	}
	if n := local.asked.Load() - asked; n != 0 {
		t.Fatalf("5 reads asked the host %d times, want 0 (the journal answers)", n)
	}

	// An answer ahead of the journal (parked later than the journal's
	// ready) is shown, and stays while the journal is behind it.
	local.says("parked", t0.Add(2*time.Second))
	s.statusAsks.fresh.Store(-1) // every read asks
	if in := read(); in.State != "parked" {
		t.Fatalf("with the answer ahead: %s, want parked", in.State)
	}
	s.statusAsks.fresh.Store(int64(time.Hour))
	if in := read(); in.State != "parked" {
		t.Fatalf("the journal behind what was shown: %s, want parked still", in.State)
	}
	local.journal(t, s, "waking", t0.Add(3*time.Second), true)
	if in := read(); in.State != "waking" {
		t.Fatalf("a journal past the answer: %s, want waking", in.State)
	}

	// A journal without a status (a host of an older version): each read
	// asks the host, as before.
	local.journal(t, s, "ready", t0.Add(4*time.Second), false)
	local.says("ready", t0.Add(4*time.Second))
	asked = local.asked.Load()
	for i := 0; i < 3; i++ {
		if in := read(); in.State != "ready" {
			t.Fatalf("from the host's answer: %s, want ready", in.State)
		}
	}
	if n := local.asked.Load() - asked; n != 3 {
		t.Fatalf("3 reads asked the host %d times, want 3 (no status in its journal)", n)
	}
}

// TestWithJournals_NewerWins: each instance shown is the newer of its
// journal's and the host's answer's, by generation then since.
func TestWithJournals_NewerWins(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name            string
		journal, answer wire.InstanceStatus
		want            string
	}{
		{"journal later", wire.InstanceStatus{ID: "d/0", Generation: 1, State: "ready", Since: t0.Add(time.Millisecond)},
			wire.InstanceStatus{ID: "d/0", Generation: 1, State: "starting", Since: t0}, "ready"},
		{"answer later", wire.InstanceStatus{ID: "d/0", Generation: 1, State: "starting", Since: t0},
			wire.InstanceStatus{ID: "d/0", Generation: 1, State: "ready", Since: t0.Add(time.Microsecond)}, "ready"},
		{"answer of a later generation", wire.InstanceStatus{ID: "d/0", Generation: 1, State: "stopped", Since: t0.Add(time.Hour)},
			wire.InstanceStatus{ID: "d/0", Generation: 2, State: "starting", Since: t0}, "starting"},
		{"same moment: the journal", wire.InstanceStatus{ID: "d/0", Generation: 1, State: "ready", Since: t0},
			wire.InstanceStatus{ID: "d/0", Generation: 1, State: "starting", Since: t0}, "ready"},
		{"answer of another instance", wire.InstanceStatus{ID: "d/0", Generation: 1, State: "ready", Since: t0},
			wire.InstanceStatus{ID: "d/1", Generation: 9, State: "parked", Since: t0.Add(time.Hour)}, "ready"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := withJournals(wire.DeploymentStatus{Name: "d", ReadyN: 7, Instances: []wire.InstanceStatus{c.answer}}, []wire.InstanceStatus{c.journal})
			if len(st.Instances) != 1 || st.Instances[0].State != c.want {
				t.Fatalf("%+v, want one instance %s", st.Instances, c.want)
			}
			if want := map[bool]int{true: 1, false: 0}[c.want == "ready"]; st.ReadyN != want {
				t.Fatalf("ready %d, want %d", st.ReadyN, want)
			}
		})
	}
}

// TestClipJournal_StatusBound: a journal's status over its bound is
// dropped (the server asks the host instead); the journal stays.
func TestClipJournal_StatusBound(t *testing.T) {
	l := defaultHostLimits
	for _, c := range []struct {
		name string
		n    int
		kept bool
	}{{"within", l.statusBytes, true}, {"over", l.statusBytes + 1, false}} {
		t.Run(c.name, func(t *testing.T) {
			j := &hostv1.InstanceJournal{InstanceId: "d/0", Deployment: "d", State: "ready", StatusJson: make([]byte, c.n)}
			l.clipJournal(j)
			if kept := len(j.GetStatusJson()) == c.n; kept != c.kept || l.checkJournal(j) != nil {
				t.Fatalf("status of %d bytes kept %v, want %v (journal: %v)", c.n, kept, c.kept, l.checkJournal(j))
			}
		})
	}
}
