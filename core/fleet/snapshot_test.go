// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"reflect"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/store"
)

// openTestState opens a State over a fresh store.
func openTestState(t *testing.T) (*State, *store.Store) {
	t.Helper()
	st, err := store.Open(store.PathIn(t.TempDir()), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	s, err := OpenState(st)
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func TestState_SnapshotRestore(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	src, _ := openTestState(t)
	for _, c := range []Command{
		{Op: OpHostJoined, Host: "gpu-a", At: at},
		{Op: OpHostJoined, Host: "gpu-b", At: at},
		{Op: OpHostDrain, Host: "gpu-b", Drain: true, At: at},
		{Op: OpPlaced, At: at, Placement: &Placement{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 2}},
			Routes: []string{"chat-model"}, Revision: 3, At: at}},
	} {
		if err := src.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.Op, err)
		}
	}
	snap, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}

	// The destination holds state of its own that the snapshot replaces.
	dst, dstStore := openTestState(t)
	for _, c := range []Command{
		{Op: OpHostJoined, Host: "stale", At: at},
		{Op: OpPlaced, At: at, Placement: &Placement{Deployment: "old", Hosts: []HostShare{{Host: "stale", Instances: 1}}, Routes: []string{"old-model"}}},
	} {
		if err := dst.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.Restore(snap); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	check := func(name string, s *State) {
		t.Helper()
		if got, want := s.Hosts(), src.Hosts(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s hosts %+v, want %+v", name, got, want)
		}
		if got, want := s.Placements(), src.Placements(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s placements %+v, want %+v", name, got, want)
		}
		if p, ok := s.RouteOwner("chat-model"); !ok || p.Deployment != "chat" {
			t.Errorf("%s: chat-model routes to %v, %v", name, p, ok)
		}
		if _, ok := s.RouteOwner("old-model"); ok {
			t.Errorf("%s: a route of the replaced state answers", name)
		}
	}
	check("restored", dst)
	// The store holds the same: a restart reads it back.
	reopened, err := OpenState(dstStore)
	if err != nil {
		t.Fatal(err)
	}
	check("reopened", reopened)

	if err := dst.Restore([]byte("not json")); err == nil {
		t.Fatal("a snapshot that does not decode was restored")
	}
	check("after a bad snapshot", dst)
}
