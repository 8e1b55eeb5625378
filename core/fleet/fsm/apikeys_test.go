// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestState_APIKeys: the named keys are replicated records: created once
// (api_key_exists after), updated, revoked; the role's key is seeded once
// per cluster; every change moves the version a keeper reloads on; the
// records survive a reopen, a snapshot and its restore; an operator's
// restore of a snapshot without keys keeps the cluster's.
func TestState_APIKeys(t *testing.T) {
	s, st := openTestState(t)
	apply := func(c Command) error {
		t.Helper()
		_, _, err := s.Apply(c)
		return err
	}
	v0 := s.KeysVersion()
	if err := apply(KeyCreated{Key: structs.APIKey{Name: "default", Role: true}, Seed: true}); err != nil || !s.KeysSeeded() {
		t.Fatalf("seed: %v (seeded %v)", err, s.KeysSeeded())
	}
	bob := structs.APIKey{Name: "bob", ID: "0123456789ab", Digest: "sha256:00", Models: []string{"demo"}, Limits: structs.KeyLimits{RPM: 5}}
	if err := apply(KeyCreated{Key: bob}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    Command
		code structs.Code
	}{
		{name: "the same name again", c: KeyCreated{Key: bob}, code: structs.CodeAPIKeyExists},
		{name: "update nobody", c: KeyUpdated{Key: structs.APIKey{Name: "nobody"}}, code: structs.CodeNotFound},
		{name: "revoke nobody", c: KeyRevoked{Name: "nobody"}, code: structs.CodeNotFound},
		{name: "a second seed changes nothing", c: KeyCreated{Key: structs.APIKey{Name: "default", Role: true, Weight: 9}, Seed: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := apply(c.c)
			if (c.code == "" && err != nil) || (c.code != "" && !structs.HasCode(err, c.code)) {
				t.Fatalf("%v, want %q", err, c.code)
			}
		})
	}
	if keys := s.APIKeys(); len(keys) != 2 || keys[1].Name != "default" || keys[1].Weight != 0 {
		t.Fatalf("keys %+v", keys)
	}
	bob.Limits.RPM = 50
	if err := apply(KeyUpdated{Key: bob}); err != nil {
		t.Fatal(err)
	}
	if err := apply(KeyRevoked{Name: "default"}); err != nil {
		t.Fatal(err)
	}
	if v := s.KeysVersion(); v != v0+4 {
		t.Fatalf("keys version %d, want %d (four changes)", v, v0+4)
	}
	// The role's key revoked stays revoked: a later seed is a no-op.
	if err := apply(KeyCreated{Key: structs.APIKey{Name: "default", Role: true}, Seed: true}); err != nil {
		t.Fatal(err)
	}
	if keys := s.APIKeys(); len(keys) != 1 || keys[0].Limits.RPM != 50 {
		t.Fatalf("keys after revoking default %+v", keys)
	}
	// Reopened from the store.
	again, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if keys := again.APIKeys(); len(keys) != 1 || keys[0].Name != "bob" || !again.KeysSeeded() {
		t.Fatalf("reopened: %+v seeded %v", keys, again.KeysSeeded())
	}
	// A snapshot carries them; its restore on another server brings them.
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := openTestState(t)
	v := other.KeysVersion()
	if err := other.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if keys := other.APIKeys(); len(keys) != 1 || keys[0].Digest != "sha256:00" || other.KeysVersion() <= v || !other.KeysSeeded() {
		t.Fatalf("restored: %+v", keys)
	}
	// An operator's restore of an older release's snapshot (no keys)
	// keeps the cluster's keys; one with keys replaces them.
	var older map[string]any
	_ = json.Unmarshal(snap, &older)
	delete(older, "api_keys")
	delete(older, "api_keys_seeded")
	oldData, _ := json.Marshal(older)
	if err := apply(Restored{State: oldData}); err != nil {
		t.Fatal(err)
	}
	if keys := s.APIKeys(); len(keys) != 1 {
		t.Fatalf("after restoring a snapshot without keys: %+v", keys)
	}
	if again, err := Open(st, nil); err != nil || len(again.APIKeys()) != 1 {
		t.Fatalf("the store after restoring a snapshot without keys: %v", err)
	}
	if err := apply(KeyCreated{Key: structs.APIKey{Name: "carol", ID: "ba9876543210", Digest: "sha256:11"}}); err != nil {
		t.Fatal(err)
	}
	before := s.KeysVersion()
	if err := apply(Restored{State: snap}); err != nil {
		t.Fatal(err)
	}
	if keys := s.APIKeys(); len(keys) != 1 || keys[0].Name != "bob" {
		t.Fatalf("after restoring a snapshot with keys: %+v", keys)
	}
	// The keepers of the keys reload: the version counts the restore.
	if v := s.KeysVersion(); v <= before {
		t.Fatalf("keys version %d after the restore, was %d", v, before)
	}
	// Every key is stored, and the seeding with them.
	if again, err := Open(st, nil); err != nil || len(again.APIKeys()) != 1 || !again.KeysSeeded() {
		t.Fatalf("the store after restoring a snapshot with keys: %v", err)
	}
}
