// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// fakeHosts is memberHosts without a host agent: each host keeps its
// group members as a host agent's management API shows them (a member's
// record, its last error, its transition's reason), reconciles them with
// its share of the server's desired state as a host agent does (make,
// start, stop, delete: core/agent/desired.go) when the server waits for
// its answer, runs the commands the server sends a member (park, wake),
// answers the server's reads of a member, and pushes a journal at each record write. As on real hosts, a
// group's head passes readiness only once every rank started (its
// collective needs them all). It keeps what it did and the calls it got
// in the order they came ("<host> make|start|stop|delete|park|wake",
// "<host> <method> <path>").
type fakeHosts struct {
	s         *Server // whose desired state the hosts reconcile
	mu        sync.Mutex
	hosts     map[string]*fakeHost
	log       []string // "<host> <method> <path>", in order
	journals  signal
	headPort  int
	refusal   map[string]structs.Code // host → what its ledger answers a member's admission
	unready   bool                    // a head never passes readiness (a stalled bring-up)
	headDies  bool                    // the head's engine exits once a worker starts (during the bring-up)
	down      map[string]bool         // hosts out of reach of the server
	createdAs map[string]structs.GroupMember
	// rejectModel: a host refuses to make a member of a model ("<host>
	// <model JSON>": its driver's plan refuses the spec); refuseModel
	// (by model JSON): a ledger refuses the member's start.
	rejectModel, refuseModel map[string]structs.Code
}

type fakeHost struct {
	changed signal
	members map[string]*fakeMember
}

type fakeMember struct {
	group    structs.GroupMember
	revision uint64 // the cluster's revision the host made it of
	model    string // its spec's model, as JSON
	desired  string
	starts   uint64
	acted    time.Time // when the host last made or started it from its share
	in       wire.InstanceStatus
}

func newFakeHosts(names ...string) *fakeHosts {
	f := &fakeHosts{hosts: map[string]*fakeHost{}, headPort: 29500, refusal: map[string]structs.Code{}, createdAs: map[string]structs.GroupMember{},
		down: map[string]bool{}, rejectModel: map[string]structs.Code{}, refuseModel: map[string]structs.Code{}}
	for _, n := range names {
		f.hosts[n] = &fakeHost{members: map[string]*fakeMember{}}
	}
	return f
}

// groupServer runs a fleet server whose hosts are f, each joined.
func groupServer(t *testing.T, f *fakeHosts) *Server { return groupServerWith(t, f, 0) }

// groupServerWith is groupServer with a group_stall_timeout (0: the
// default).
func groupServerWith(t *testing.T, f *fakeHosts, stall time.Duration) *Server {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := ServerOptions{StateDir: dir, Listen: "127.0.0.1:0", Store: st, GroupStallTimeout: stall}
	s := startTestServerWith(t, o, func(s *Server) { s.hostIO, f.s = f, s })
	for name := range f.hosts {
		if err := s.apply(fsm.HostJoined{Host: name}); err != nil {
			t.Fatal(err)
		}
	}
	// The hosts' shares are the leader's: its work starts with the
	// leadership's notification.
	poll.Until(t, 10*time.Second, "the server's leader work started", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.leaderCtx != nil
	})
	return s
}

func (f *fakeHosts) call(_ context.Context, _ time.Duration, host, method, path string, _ http.Header, body []byte) (int, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hosts[host]
	if h == nil || f.down[host] {
		return 0, nil, structs.Errf(structs.CodeHostUnreachable, "host %s", host).WithDetail("host", host)
	}
	f.log = append(f.log, host+" "+method+" "+path)
	rest, _ := strings.CutPrefix(path, "/deployments")
	name, action, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	switch {
	case h.members[name] == nil:
		return answer(http.StatusNotFound, wire.ErrorEnvelope{Error: wire.ErrorBody{Code: string(structs.CodeNotFound), Message: "no deployment " + name}})
	case method == http.MethodGet && action == "":
		m := h.members[name]
		g := m.group
		return answer(http.StatusOK, wire.DeploymentStatus{Name: name, Desired: m.desired,
			Spec: &structs.Deployment{Name: name, Group: &g}, Instances: []wire.InstanceStatus{m.in}})
	}
	return answer(http.StatusNotFound, wire.ErrorEnvelope{Error: wire.ErrorBody{Code: string(structs.CodeNotFound), Message: path}})
}

// applied reconciles a host's members with its share of the server's
// desired state, as a host agent does on each share, and answers it.
func (f *fakeHosts) applied(_ context.Context, host string, _ uint64) (*hostv1.DesiredApplied, error) {
	if !f.reachable(host) {
		return nil, structs.Errf(structs.CodeHostUnreachable, "host %s", host).WithDetail("host", host)
	}
	d := f.s.desiredFor(host)
	if d == nil {
		return nil, structs.Errf(structs.CodeNotLeader, "the server does not lead")
	}
	started := time.Now()
	return &hostv1.DesiredApplied{Term: d.GetTerm(), Index: d.GetIndex(), Results: f.reconcile(host, d), StartedUnixMs: started.UnixMilli()}, nil
}

// reconcile makes, starts, stops and deletes a host's members as its
// share says: the head's host picks the rendezvous port (and answers
// it); a start (desired running, or a new start) goes to the host's
// ledger, which admits the member (starting, a ledger phase) or refuses
// it (stopped, with the refusal as last error).
func (f *fakeHosts) reconcile(host string, d *hostv1.Desired) []*hostv1.DesiredResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hosts[host]
	want := map[string]bool{}
	var out []*hostv1.DesiredResult
	for _, dd := range d.GetDeployments() {
		var spec struct {
			Group structs.GroupMember `json:"group"`
			Model json.RawMessage     `json:"model"`
		}
		if err := json.Unmarshal(dd.GetSpecJson(), &spec); err != nil {
			out = append(out, &hostv1.DesiredResult{Kind: "deployment", Name: dd.GetName(), Code: string(structs.CodeInvalidRequest), Message: err.Error()})
			continue
		}
		name := dd.GetName()
		want[name] = true
		if code, ok := f.rejectModel[host+" "+string(spec.Model)]; ok {
			out = append(out, &hostv1.DesiredResult{Kind: "deployment", Name: name, Code: string(code), Message: "the driver refuses model " + string(spec.Model)})
			continue
		}
		m := h.members[name]
		if m != nil && m.revision != dd.GetRevision() {
			// A new revision: the old member stops, the new one is made
			// in its place (its desired state kept), as the host's
			// lifecycle.Deploy does.
			if m.in.State != string(structs.StateStopped) {
				f.move(m, structs.StateStopped, "")
			}
			m.revision, m.model, m.acted = dd.GetRevision(), string(spec.Model), time.Now()
			f.log = append(f.log, host+" revise")
			f.publishLocked(h)
		}
		if m == nil {
			g := spec.Group
			if g.Rank == 0 {
				g.HeadAddress, g.RendezvousPort = host+".lan", f.headPort
			}
			f.createdAs[host] = spec.Group
			m = &fakeMember{group: g, acted: time.Now(), revision: dd.GetRevision(), model: string(spec.Model),
				in: wire.InstanceStatus{ID: structs.InstanceID(name, 0), Host: host, State: string(structs.StateStopped), Since: time.Now()}}
			h.members[name] = m
			f.log = append(f.log, host+" make")
		}
		switch want := dd.GetDesired(); {
		case want == structs.DesiredRunning && (m.desired != structs.DesiredRunning || dd.GetStarts() > m.starts):
			m.starts, m.acted = dd.GetStarts(), time.Now()
			f.log = append(f.log, host+" start")
			f.act(host, h, name, wire.ActionStart)
			if f.headDies && m.group.Rank > 0 {
				f.exitLocked(m.group.Hosts[0], name, 1)
			}
		case want == structs.DesiredStopped && m.desired != structs.DesiredStopped:
			f.log = append(f.log, host+" stop")
			f.act(host, h, name, wire.ActionStop)
		case m.desired == "":
			m.desired = want
		}
		r := &hostv1.DesiredResult{Kind: "deployment", Name: name, ActedUnixMs: m.acted.UnixMilli()}
		if m.group.Rank == 0 {
			r.HeadAddress, r.RendezvousPort = m.group.HeadAddress, int32(m.group.RendezvousPort)
		}
		out = append(out, r)
	}
	for name := range h.members {
		if !want[name] {
			delete(h.members, name)
			f.log = append(f.log, host+" delete")
			f.publishLocked(h)
		}
	}
	return out
}

// command runs a member's park or wake as a host's command handler
// does (core/agent/commands.go), once the server's term is checked.
func (f *fakeHosts) command(_ context.Context, host string, a *hostv1.DeploymentAction) error {
	if !f.reachable(host) {
		return structs.Errf(structs.CodeHostUnreachable, "host %s is not connected", host).WithDetail("host", host)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hosts[host]
	if h.members[a.GetDeployment()] == nil {
		return structs.Errf(structs.CodeNotFound, "host %s: no deployment %s", host, a.GetDeployment()).WithDetail("host", host)
	}
	what := map[string]string{wire.ActionPark: "park", wire.ActionStart: "wake"}[a.GetAction()]
	f.log = append(f.log, host+" "+what)
	f.act(host, h, a.GetDeployment(), a.GetAction())
	return nil
}

// act runs an action on a member and pushes its journal.
func (f *fakeHosts) act(host string, h *fakeHost, name, action string) {
	m := h.members[name]
	switch action {
	case wire.ActionStart:
		m.desired = structs.DesiredRunning
		code, refused := f.refusal[host]
		if c, ok := f.refuseModel[m.model]; ok {
			code, refused = c, true
		}
		if refused {
			m.in.LastError = &structs.ErrorRecord{Code: code, Message: "no room on gpu0 for the member", At: time.Now()}
			f.move(m, structs.StateStopped, "")
			break
		}
		f.move(m, structs.StateStarting, "")
		m.in.Phase = "loading"
		f.headReadyLocked(name)
	case wire.ActionStop:
		m.desired = structs.DesiredStopped
		if m.in.State != string(structs.StateStopped) {
			f.move(m, structs.StateStopped, "")
		}
	case wire.ActionPark:
		f.move(m, structs.StateParked, "")
	}
	f.publishLocked(h)
}

func (f *fakeHosts) move(m *fakeMember, to structs.InstanceState, reason structs.TransitionReason) {
	m.in.State, m.in.Reason, m.in.Since, m.in.Phase = string(to), string(reason), time.Now(), ""
}

// headReadyLocked makes a group's head ready once every rank started.
func (f *fakeHosts) headReadyLocked(name string) {
	var head *fakeMember
	var headHost *fakeHost
	started := 0
	for _, h := range f.hosts {
		m := h.members[name]
		if m == nil {
			continue
		}
		if m.in.State == string(structs.StateStarting) || m.in.State == string(structs.StateReady) {
			started++
		}
		if m.group.Rank == 0 {
			head, headHost = m, h
		}
	}
	if head != nil && !f.unready && started == head.group.Size && head.in.State == string(structs.StateStarting) {
		f.move(head, structs.StateReady, "")
		head.in.Residency = "host_backed" // a vLLM head sleeps at level 1
		f.publishLocked(headHost)
	}
}

func (f *fakeHosts) publishLocked(h *fakeHost) {
	h.changed.publish()
	f.journals.publish()
}

// exit ends a member's engine on its own (engine_exited), as a killed
// rank's host records it, and pushes its journal.
func (f *fakeHosts) exit(host, name string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exitLocked(host, name, code)
}

func (f *fakeHosts) exitLocked(host, name string, code int) {
	m := f.hosts[host].members[name]
	m.in.LastError = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: fmt.Sprintf("the engine exited with code %d", code), At: time.Now()}
	f.move(m, structs.StateStopped, structs.ReasonEngineExited)
	f.publishLocked(f.hosts[host])
}

func (f *fakeHosts) changes(hosts []string, more ...<-chan struct{}) hostChanges {
	var cs hostChanges
	for _, host := range hosts {
		if h := f.hosts[host]; h != nil {
			cs = append(cs, recvCase(h.changed.changed()))
		}
	}
	for _, ch := range more {
		cs = append(cs, recvCase(ch))
	}
	return cs
}

func (f *fakeHosts) journaled() <-chan struct{} { return f.journals.changed() }

func (f *fakeHosts) journal(host, id string) *hostv1.InstanceJournal {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[host] {
		return nil // its link is down
	}
	for name, m := range f.hosts[host].members {
		if m.in.ID == id {
			j := &hostv1.InstanceJournal{InstanceId: id, Deployment: name, State: m.in.State,
				SinceUnixMs: m.in.Since.UnixMilli(), Why: m.in.Reason, Phase: m.in.Phase, Placed: true, Revision: m.revision, Residency: m.in.Residency}
			if e := m.in.LastError; e != nil {
				j.Message, j.ErrorCode, j.ErrorMessage, j.ErrorUnixMs = e.Message, string(e.Code), e.Message, e.At.UnixMilli()
			}
			return j
		}
	}
	return nil
}

func (f *fakeHosts) reachable(host string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hosts[host] != nil && !f.down[host]
}

// setDown takes a host out of the server's reach, or brings it back.
func (f *fakeHosts) setDown(host string, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down[host] = down
	f.hosts[host].changed.publish()
}

// calls returns the calls made so far that match, in order.
func (f *fakeHosts) calls(match func(string) bool) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.log {
		if match(c) {
			out = append(out, c)
		}
	}
	return out
}

// member returns a host's member of name (nil: none there).
func (f *fakeHosts) member(host, name string) *fakeMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.hosts[host].members[name]
	if m == nil {
		return nil
	}
	c := *m
	return &c
}

func answer(status int, v any) (int, []byte, error) {
	data, err := json.Marshal(v)
	return status, data, err
}
