// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var at = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// memLog is a log of one server that commits at once: the entries'
// indexes count from 1.
type memLog struct {
	mu    sync.Mutex
	s     *State
	index uint64
}

func (l *memLog) Propose(data []byte) (Result, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	return l.s.ApplyEntry(l.index, data), l.index, nil
}

// openTestState opens a State over a fresh store, with a memLog.
func openTestState(t *testing.T) (*State, *store.Store) {
	t.Helper()
	st, err := store.Open(store.PathIn(t.TempDir()), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	s, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLog(&memLog{s: s})
	return s, st
}

func mustEncode(t *testing.T, c Command) []byte {
	t.Helper()
	data, err := Encode(c, at)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestDecode(t *testing.T) {
	cases := []struct {
		name    string
		data    string
		want    Command
		unknown bool
		ignore  bool
	}{
		{name: "typed", data: string(mustEncode(t, HostDrain{Host: "gpu-a", Drain: true})), want: HostDrain{Host: "gpu-a", Drain: true}},
		{name: "a first release's record", data: `{"op":"host_drain","at":"2026-01-02T03:04:05Z","host":"gpu-a","drain":true}`,
			want: HostDrain{Host: "gpu-a", Drain: true}},
		{name: "a first release's placement", data: `{"op":"placed","placement":{"deployment":"chat","hosts":[{"host":"gpu-a","instances":1}]}}`,
			want: Placed{Placement: &Placement{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}}}},
		{name: "an unknown type flagged ignorable", data: `{"op":"future","v":1,"ignorable":true,"body":{}}`, unknown: true, ignore: true},
		{name: "an unknown type", data: `{"op":"future","v":1,"body":{}}`, unknown: true},
		{name: "a newer version of a known type", data: `{"op":"host_joined","v":2,"body":{"host":"gpu-a"}}`, unknown: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env, cmd, err := Decode([]byte(c.data))
			var unknown *UnknownCommandError
			if got := errors.As(err, &unknown); got != c.unknown {
				t.Fatalf("Decode: %v (unknown %v, want %v)", err, got, c.unknown)
			}
			if env.Ignorable != c.ignore {
				t.Errorf("ignorable %v, want %v", env.Ignorable, c.ignore)
			}
			if !c.unknown && !reflect.DeepEqual(cmd, c.want) {
				t.Errorf("Decode = %#v, want %#v", cmd, c.want)
			}
		})
	}
}

func TestState_ApplyEntry(t *testing.T) {
	s, _ := openTestState(t)
	if r := s.ApplyEntry(1, mustEncode(t, HostJoined{Host: "gpu-a"})); r.Err != nil {
		t.Fatal(r.Err)
	}
	// A replay changes nothing: the host's drain of entry 2 stays.
	if r := s.ApplyEntry(2, mustEncode(t, HostDrain{Host: "gpu-a", Drain: true})); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := s.ApplyEntry(2, mustEncode(t, HostDrain{Host: "gpu-a"})); r.Err != nil {
		t.Fatal(r.Err)
	}
	if h, _ := s.Host("gpu-a"); !h.Drained {
		t.Fatal("a replayed entry was applied again")
	}
	// A refusal is consumed: the index moves on, the state does not.
	r := s.ApplyEntry(3, mustEncode(t, HostDrain{Host: "gpu-z", Drain: true}))
	if structs.CodeOf(r.Err) != structs.CodeNotFound || s.Applied() != 3 {
		t.Fatalf("a refused command: %v, applied %d", r.Err, s.Applied())
	}
	// An unknown command flagged ignorable is skipped.
	if r := s.ApplyEntry(4, []byte(`{"op":"future","v":1,"ignorable":true,"body":{}}`)); r.Err != nil || s.Applied() != 4 {
		t.Fatalf("an ignorable unknown command: %v, applied %d", r.Err, s.Applied())
	}
	select {
	case <-s.Halted():
		t.Fatal("halted on an ignorable command")
	default:
	}
	// Any other unknown command halts: nothing applies after it.
	r = s.ApplyEntry(5, []byte(`{"op":"future","v":1,"body":{}}`))
	var unknown *UnknownCommandError
	if !errors.As(r.Err, &unknown) || unknown.Index != 5 {
		t.Fatalf("an unknown command: %v", r.Err)
	}
	select {
	case <-s.Halted():
	default:
		t.Fatal("not halted on an unknown command")
	}
	if r := s.ApplyEntry(6, mustEncode(t, HostJoined{Host: "gpu-b"})); r.Err == nil {
		t.Fatal("a halted state applied an entry")
	}
	if _, ok := s.Host("gpu-b"); ok || s.Applied() != 4 {
		t.Fatalf("the halted state moved: applied %d", s.Applied())
	}
}

// TestState_ReopenKeepsTheIndex: a restarted server replays the log from
// its last snapshot; what the store applied already is skipped.
func TestState_ReopenKeepsTheIndex(t *testing.T) {
	s, st := openTestState(t)
	for _, c := range []Command{HostJoined{Host: "gpu-a"}, HostJoined{Host: "gpu-b"}, HostRemoved{Host: "gpu-b"}} {
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	again, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Applied() != 3 {
		t.Fatalf("applied after reopen = %d, want 3", again.Applied())
	}
	again.ApplyEntry(2, mustEncode(t, HostJoined{Host: "gpu-b"}))
	if _, ok := again.Host("gpu-b"); ok {
		t.Fatal("a replay brought a removed host back")
	}
}

func TestState_WaitApplied(t *testing.T) {
	s, _ := openTestState(t)
	done := make(chan error, 1)
	go func() { done <- s.WaitApplied(context.Background(), 2) }()
	for _, c := range []Command{HostJoined{Host: "gpu-a"}, HostJoined{Host: "gpu-b"}} {
		select {
		case err := <-done:
			t.Fatalf("WaitApplied returned before entry 2: %v", err)
		default:
		}
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitApplied(ctx, 99); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitApplied with an ended context: %v", err)
	}
}

func TestState_SnapshotRestore(t *testing.T) {
	src, _ := openTestState(t)
	for _, c := range []Command{
		ClusterConfigured{Expect: 3},
		HostJoined{Host: "gpu-a"}, HostJoined{Host: "gpu-b"}, HostDrain{Host: "gpu-b", Drain: true},
		Placed{Placement: &Placement{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 2}}, Routes: []string{"chat-model"}, Revision: 3, At: at}},
	} {
		if _, _, err := src.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.CommandType(), err)
		}
	}
	snap, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dst, st := openTestState(t)
	for _, c := range []Command{
		HostJoined{Host: "stale"},
		Placed{Placement: &Placement{Deployment: "old", Hosts: []HostShare{{Host: "stale", Instances: 1}}, Routes: []string{"old-model"}}},
	} {
		if _, _, err := dst.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.Restore(snap); err != nil {
		t.Fatal(err)
	}
	check := func(s *State) {
		t.Helper()
		if !reflect.DeepEqual(s.Hosts(), src.Hosts()) || !reflect.DeepEqual(s.Placements(), src.Placements()) {
			t.Errorf("restored %+v %+v, want %+v %+v", s.Hosts(), s.Placements(), src.Hosts(), src.Placements())
		}
		if p, ok := s.RouteOwner("chat-model"); !ok || p.Deployment != "chat" {
			t.Error("the restored routes do not answer chat-model")
		}
		if _, ok := s.RouteOwner("old-model"); ok {
			t.Error("a route of the replaced state still answers")
		}
		if c := s.Cluster(); c == nil || c.Expect != 3 || s.Applied() != src.Applied() {
			t.Errorf("cluster %+v applied %d, want expect 3 applied %d", c, s.Applied(), src.Applied())
		}
	}
	check(dst)
	again, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(again)
	// A snapshot that does not hold together changes nothing.
	bad, _ := json.Marshal(snapshotData{Hosts: []HostRecord{{Name: "a"}}, Placements: []*Placement{{Deployment: "x", Hosts: []HostShare{{Host: "b"}}}}})
	if err := dst.Restore(bad); structs.CodeOf(err) != structs.CodeSnapshotInvalid {
		t.Fatalf("Restore of a bad snapshot: %v", err)
	}
	check(dst)
}

// TestState_RestoredCommand replaces hosts and placements through the log
// and keeps the cluster's own record.
func TestState_RestoredCommand(t *testing.T) {
	s, st := openTestState(t)
	for _, c := range []Command{ClusterConfigured{Expect: 3}, HostJoined{Host: "old"}} {
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	state, _ := json.Marshal(snapshotData{Hosts: []HostRecord{{Name: "gpu-a", JoinedAt: at}},
		Placements: []*Placement{{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}, Routes: []string{"chat"}}}})
	if _, _, err := s.Apply(Restored{State: state}); err != nil {
		t.Fatal(err)
	}
	again, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*State{s, again} {
		if _, ok := v.Host("old"); ok || len(v.Hosts()) != 1 || len(v.Placements()) != 1 || v.Cluster().Expect != 3 {
			t.Errorf("after restored: hosts %+v, placements %d, cluster %+v", v.Hosts(), len(v.Placements()), v.Cluster())
		}
	}
}

func TestState_PlacedRefusals(t *testing.T) {
	s, _ := openTestState(t)
	if _, _, err := s.Apply(HostJoined{Host: "gpu-a"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Apply(Placed{Placement: &Placement{Deployment: "a", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}, Routes: []string{"m"}}}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    Command
		want structs.Code
	}{
		{"an unknown host", Placed{Placement: &Placement{Deployment: "b", Hosts: []HostShare{{Host: "gpu-z", Instances: 1}}}}, structs.CodeNotFound},
		{"a route taken", Placed{Placement: &Placement{Deployment: "b", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}, Routes: []string{"m"}}}, structs.CodeConflict},
		{"a host that runs a placement", HostRemoved{Host: "gpu-a"}, structs.CodeConflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, _, err := s.Apply(c.c); structs.CodeOf(err) != c.want {
				t.Fatalf("apply: %v, want %s", err, c.want)
			}
		})
	}
}

// BenchmarkState_RebuildRoutes rebuilds the model name index of 1,000
// placements (every placement change does).
func BenchmarkState_RebuildRoutes(b *testing.B) {
	st, err := store.Open(store.PathIn(b.TempDir()), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	s, err := Open(st, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("dep-%04d", i)
		s.placements[name] = &Placement{Deployment: name, Routes: []string{fmt.Sprintf("model-%04d", i), fmt.Sprintf("alias-%04d", i)},
			Hosts: []HostShare{{Host: "gpu-000", Instances: 1}}}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.mu.Lock()
		s.rebuildRoutes()
		s.mu.Unlock()
	}
}

// TestState_ResetApplied: a state whose store recorded an index of an
// earlier log applies a new log from its first entry once reset.
func TestState_ResetApplied(t *testing.T) {
	s, _ := openTestState(t)
	for _, c := range []Command{HostJoined{Host: "gpu-a"}, HostJoined{Host: "gpu-b"}} {
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ResetApplied(); err != nil {
		t.Fatal(err)
	}
	if r := s.ApplyEntry(1, mustEncode(t, HostJoined{Host: "gpu-c"})); r.Err != nil {
		t.Fatal(r.Err)
	}
	if _, ok := s.Host("gpu-c"); !ok || len(s.Hosts()) != 3 {
		t.Fatalf("the new log's first entry: hosts %+v", s.Hosts())
	}
}

// TestState_PlacedExpectsItsVersion: a checked change lands only on the
// version it was made from.
func TestState_PlacedExpectsItsVersion(t *testing.T) {
	s, _ := openTestState(t)
	if _, _, err := s.Apply(HostJoined{Host: "gpu-a"}); err != nil {
		t.Fatal(err)
	}
	p := &Placement{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}, Spec: json.RawMessage(`{"name":"chat"}`)}
	v, _, err := s.Apply(Placed{Placement: p, Checked: true})
	if err != nil || v != uint64(1) {
		t.Fatalf("a new placement: version %v, %v", v, err)
	}
	if _, _, err := s.Apply(Placed{Placement: p, Checked: true}); structs.CodeOf(err) != structs.CodeConflict {
		t.Fatalf("a second new placement of the name: %v, want conflict", err)
	}
	if v, _, err := s.Apply(Placed{Placement: p, Checked: true, Expect: 1}); err != nil || v != uint64(2) {
		t.Fatalf("a change of version 1: %v, %v", v, err)
	}
	if _, _, err := s.Apply(Placed{Placement: p, Checked: true, Expect: 1}); structs.CodeOf(err) != structs.CodeConflict {
		t.Fatalf("a change made from an old version: %v, want conflict", err)
	}
	if got, _ := s.Placement("chat"); !got.Managed() || got.Version != 2 {
		t.Fatalf("the placement: %+v", got)
	}
}

// TestState_ClusterExpectOnlyGrows: the leader raises the expected size
// to its voter count as servers join; two joins' commands committed in
// the other order (a count read before the other join applied) must not
// lower it.
func TestState_ClusterExpectOnlyGrows(t *testing.T) {
	s, _ := openTestState(t)
	for i, expect := range []int{1, 3, 2} {
		if r := s.ApplyEntry(uint64(i+1), mustEncode(t, ClusterConfigured{Expect: expect})); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if c := s.Cluster(); c == nil || c.Expect != 3 {
		t.Fatalf("the expected size after 1, 3, then a late 2: %+v, want 3", c)
	}
}
