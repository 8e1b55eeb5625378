// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"errors"
	"maps"
	"slices"
	"testing"
)

func TestStore_ReplaceFleetState(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	for _, k := range []string{"host/a", "host/b", "placement/x"} {
		if _, err := s.ApplyFleet([]byte(`{}`), func(st *FleetState) error { return st.Put(k, k) }); err != nil {
			t.Fatal(err)
		}
	}
	keys := func() []string {
		t.Helper()
		m, err := s.FleetStateList("")
		if err != nil {
			t.Fatal(err)
		}
		return slices.Sorted(maps.Keys(m))
	}

	// A fill that fails changes nothing.
	boom := errors.New("boom")
	err := s.ReplaceFleetState(func(st *FleetState) error {
		if err := st.Put("host/c", "c"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("ReplaceFleetState: %v, want boom", err)
	}
	if got, want := keys(), []string{"host/a", "host/b", "placement/x"}; !slices.Equal(got, want) {
		t.Fatalf("after a failed replace: %v, want %v", got, want)
	}

	// Every key goes, the new ones stay.
	if err := s.ReplaceFleetState(func(st *FleetState) error { return st.Put("host/c", "c") }); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(), []string{"host/c"}; !slices.Equal(got, want) {
		t.Fatalf("after a replace: %v, want %v", got, want)
	}
	var v string
	if ok, err := fleetGet(s, "host/c", &v); err != nil || !ok || v != "c" {
		t.Fatalf("host/c = %q, %v, %v", v, ok, err)
	}
}

// fleetGet reads one state key through a view transaction.
func fleetGet(s *Store, key string, v any) (found bool, err error) {
	err = s.View(func(tx *Tx) error {
		found, err = (&FleetState{tx: tx}).Get(key, v)
		return err
	})
	return found, err
}
