// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func TestStore_APIKeys(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	put := func(k structs.APIKey) {
		t.Helper()
		if err := s.Update(func(tx *Tx) error { return tx.PutAPIKey(&k) }); err != nil {
			t.Fatal(err)
		}
	}
	put(structs.APIKey{Name: "bob", ID: "aaaaaaaaaaaa", Digest: "sha256:1", Models: []string{"demo"}})
	put(structs.APIKey{Name: "default", Role: true})
	if err := s.PutKeyUses(map[string]structs.KeyUse{"aaaaaaaaaaaa": {Name: "bob", FirstUsedAt: time.Unix(1, 0)},
		"zzz": {Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	uses, err := s.KeyUses()
	if err != nil || len(uses) != 1 || uses["aaaaaaaaaaaa"].Name != "bob" {
		t.Fatalf("uses = %+v, %v (a use of a key not stored is left out)", uses, err)
	}
	// A new key under the same name replaces the old one's index entry.
	put(structs.APIKey{Name: "bob", ID: "bbbbbbbbbbbb", Digest: "sha256:2"})
	err = s.View(func(tx *Tx) error {
		if v := tx.bucket(bucketAPIKeyIDs).Get([]byte("aaaaaaaaaaaa")); v != nil {
			t.Errorf("the old identifier still names %q", v)
		}
		if v := tx.bucket(bucketAPIKeyIDs).Get([]byte("bbbbbbbbbbbb")); string(v) != "bob" {
			t.Errorf("the new identifier names %q", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	if err := s.Update(func(tx *Tx) (err error) { found, err = tx.DeleteAPIKey("bob"); return err }); err != nil || !found {
		t.Fatalf("delete = %v, %v", found, err)
	}
	keys, _ := s.APIKeys()
	if len(keys) != 1 || keys[0].Name != "default" {
		t.Fatalf("keys after delete = %+v", keys)
	}
	if err := s.Update(func(tx *Tx) (err error) { found, err = tx.DeleteAPIKey("bob"); return err }); err != nil || found {
		t.Fatalf("second delete = %v, %v", found, err)
	}
}

func TestStore_Usage(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	h0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	add := func(rows ...structs.KeyUsage) {
		t.Helper()
		if err := s.Update(func(tx *Tx) error { return tx.AddUsage(rows) }); err != nil {
			t.Fatal(err)
		}
	}
	add(structs.KeyUsage{Hour: h0.Add(5 * time.Minute), Key: "bob", Model: "demo", Requests: 1, PromptTokens: 5, CompletionTokens: 7},
		structs.KeyUsage{Hour: h0, Key: "alice", Model: "demo", Requests: 2, Errors: map[string]int64{"rate_limited": 1}})
	add(structs.KeyUsage{Hour: h0, Key: "bob", Model: "demo", Requests: 2, PromptTokens: 1, CompletionTokens: 1, CachedTokens: 1,
		Errors: map[string]int64{"unknown_model": 1}},
		structs.KeyUsage{Hour: h0.Add(2 * time.Hour), Key: "bob", Model: "chat-a", Requests: 1})
	cases := []struct {
		name  string
		f     UsageFilter
		rows  int
		check func(t *testing.T, rows []structs.KeyUsage)
	}{
		{name: "everything", f: UsageFilter{}, rows: 3},
		{name: "one key", f: UsageFilter{Key: "bob"}, rows: 2, check: func(t *testing.T, rows []structs.KeyUsage) {
			r := rows[0]
			if r.Requests != 3 || r.PromptTokens != 6 || r.CompletionTokens != 8 || r.CachedTokens != 1 || r.Errors["unknown_model"] != 1 {
				t.Errorf("summed row = %+v", r)
			}
		}},
		{name: "one model", f: UsageFilter{Model: "chat-a"}, rows: 1},
		{name: "since a later hour", f: UsageFilter{Since: h0.Add(90 * time.Minute)}, rows: 1},
		{name: "a key with no rows", f: UsageFilter{Key: "carol"}, rows: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows, err := s.Usage(c.f)
			if err != nil || len(rows) != c.rows {
				t.Fatalf("rows = %+v, %v; want %d", rows, err, c.rows)
			}
			if c.check != nil {
				c.check(t, rows)
			}
		})
	}
	var n int
	if err := s.Update(func(tx *Tx) (err error) { n, err = tx.PruneUsage(h0.Add(time.Hour), 10); return err }); err != nil || n != 2 {
		t.Fatalf("prune = %d, %v; want the two rows of the first hour", n, err)
	}
	if rows, _ := s.Usage(UsageFilter{}); len(rows) != 1 || rows[0].Model != "chat-a" {
		t.Fatalf("rows after prune = %+v", rows)
	}
}
