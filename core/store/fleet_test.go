// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"errors"
	"maps"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestStore_ReplaceFleetState(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	for _, k := range []string{"host/a", "host/b", "placement/x"} {
		if err := s.UpdateFleet(func(st *FleetState) error { return st.Put(k, k) }); err != nil {
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

// TestStore_MigrateV4DropsTheFleetLog opens a schema-3 file whose server
// kept its own command log beside its state: the log goes, the state
// stays (raft's log is the one log from schema 4 on).
func TestStore_MigrateV4DropsTheFleetLog(t *testing.T) {
	path := PathIn(t.TempDir())
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrate(db, migrations[:3]); err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketFleetLog).Put(u64(1), []byte(`{"op":"host_joined","host":"gpu-a"}`)); err != nil {
			return err
		}
		return tx.Bucket(bucketFleetState).Put([]byte("host/gpu-a"), []byte(`{"name":"gpu-a"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, _ := s.SchemaVersion(); v != CurrentSchemaVersion() {
		t.Fatalf("schema version %d, want %d", v, CurrentSchemaVersion())
	}
	_ = s.View(func(tx *Tx) error {
		if tx.tx.Bucket(bucketFleetLog) != nil {
			t.Error("the fleet_log bucket is still there")
		}
		return nil
	})
	if m, err := s.FleetStateList("host/"); err != nil || len(m) != 1 {
		t.Fatalf("the state after the migration: %v, %v", m, err)
	}
}
