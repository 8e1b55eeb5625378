// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package responses

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func rec(id, owner, prev string, at time.Time, input, output string) structs.StoredResponse {
	return structs.StoredResponse{ID: id, Owner: owner, PreviousID: prev, CreatedAt: at,
		Input: json.RawMessage(input), Response: json.RawMessage(`{"id":"` + id + `","output":` + output + `}`)}
}

// clock is a settable clock.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) set(t time.Time)     { c.ns.Store(t.UnixNano()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.set(t)
	return c
}

// TestStore_OwnerAndVisibility: a Put is readable at once (before its
// commit) and after it; only by its owner; Delete removes it for good.
func TestStore_OwnerAndVisibility(t *testing.T) {
	st := openStore(t)
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	c := newClock(t0)
	// An interval that never passes during the test: the record is
	// readable only from the pending set until Flush.
	s := Open(st, Options{Interval: time.Hour, Now: c.now})
	defer s.Close()
	s.Put(rec("resp_a", "alice", "", t0, `[{"role":"user","content":"hi"}]`, `[]`))
	if _, err := st.GetResponse("resp_a"); err == nil {
		t.Fatal("committed before its interval: the test cannot see the pending read")
	}
	if r, err := s.Get("alice", "resp_a"); err != nil || r.ID != "resp_a" {
		t.Fatalf("pending get: %v %v", r, err)
	}
	if _, err := s.Get("bob", "resp_a"); !structs.HasCode(err, structs.CodeResponseNotFound) {
		t.Fatalf("bob read alice's response: %v", err)
	}
	s.Flush()
	if _, err := st.GetResponse("resp_a"); err != nil {
		t.Fatalf("not committed by Flush: %v", err)
	}
	if _, err := s.Get("bob", "resp_a"); !structs.HasCode(err, structs.CodeResponseNotFound) {
		t.Fatalf("bob read alice's committed response: %v", err)
	}
	if err := s.Delete("bob", "resp_a"); !structs.HasCode(err, structs.CodeResponseNotFound) {
		t.Fatalf("bob deleted alice's response: %v", err)
	}
	if err := s.Delete("alice", "resp_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("alice", "resp_a"); !structs.HasCode(err, structs.CodeResponseNotFound) {
		t.Fatalf("deleted, still read: %v", err)
	}
	// A pending record deleted before its commit is not committed later.
	s.Put(rec("resp_b", "alice", "", t0, `[]`, `[]`))
	if err := s.Delete("alice", "resp_b"); err != nil {
		t.Fatal(err)
	}
	s.Flush()
	if _, err := st.GetResponse("resp_b"); err == nil {
		t.Fatal("a deleted pending record was committed")
	}
}

// TestStore_History: a chain's items, oldest first: each turn's input,
// then its output; a missing link is named.
func TestStore_History(t *testing.T) {
	st := openStore(t)
	t0 := time.Now()
	s := Open(st, Options{})
	defer s.Close()
	s.Put(rec("resp_1", "alice", "", t0, `[{"role":"user","content":"one"}]`, `[{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}]`))
	s.Put(rec("resp_2", "alice", "resp_1", t0, `[{"type":"function_call_output","call_id":"c1","output":"r"}]`, `[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"two"}]}]`))
	s.Flush()
	s.Put(rec("resp_3", "alice", "resp_2", t0, `[{"role":"user","content":"three"}]`, `[]`))
	items, err := s.History("alice", "resp_3")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range items {
		got = append(got, string(it))
	}
	want := []string{`{"role":"user","content":"one"}`, `{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`,
		`{"type":"function_call_output","call_id":"c1","output":"r"}`, `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"two"}]}`,
		`{"role":"user","content":"three"}`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("history:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := s.History("bob", "resp_3"); !structs.HasCode(err, structs.CodeResponseNotFound) {
		t.Fatalf("bob walked alice's chain: %v", err)
	}
	if err := s.Delete("alice", "resp_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.History("alice", "resp_3"); !structs.HasCode(err, structs.CodeResponseNotFound) || !strings.Contains(err.Error(), "resp_1") {
		t.Fatalf("a broken chain: %v", err)
	}
}

// TestStore_RetentionAndBound: a response past the retention reads as
// absent and is pruned; the size bound removes the oldest; a negative
// retention keeps nothing.
func TestStore_RetentionAndBound(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	t.Run("retention", func(t *testing.T) {
		st := openStore(t)
		c := newClock(t0)
		s := Open(st, Options{Retention: 24 * time.Hour, Now: c.now})
		defer s.Close()
		s.Put(rec("resp_old", "alice", "", t0, `[]`, `[]`))
		s.Flush()
		c.add(25 * time.Hour)
		if _, err := s.Get("alice", "resp_old"); !structs.HasCode(err, structs.CodeResponseNotFound) {
			t.Fatalf("an expired response read: %v", err)
		}
		s.Put(rec("resp_new", "alice", "", c.now(), `[]`, `[]`))
		s.Flush() // a commit prunes
		if _, err := st.GetResponse("resp_old"); err == nil {
			t.Fatal("the expired response is still stored")
		}
		if _, err := s.Get("alice", "resp_new"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("size bound", func(t *testing.T) {
		st := openStore(t)
		one := rec("resp_0", "alice", "", t0, `["`+strings.Repeat("x", 1000)+`"]`, `[]`)
		s := Open(st, Options{MaxBytes: 3 * one.Size(), Now: func() time.Time { return t0.Add(time.Hour) }})
		defer s.Close()
		for i := 0; i < 5; i++ {
			r := rec("resp_"+string(rune('0'+i)), "alice", "", t0.Add(time.Duration(i)*time.Second), `["`+strings.Repeat("x", 1000)+`"]`, `[]`)
			s.Put(r)
			s.Flush()
		}
		for i, want := range []bool{false, false, true, true, true} {
			_, err := s.Get("alice", "resp_"+string(rune('0'+i)))
			if (err == nil) != want {
				t.Errorf("resp_%d kept %v, want %v", i, err == nil, want)
			}
		}
		if n, _ := st.ResponseBytes(); n > 3*one.Size() {
			t.Errorf("stored %d bytes over the bound %d", n, 3*one.Size())
		}
	})
	t.Run("keeps nothing", func(t *testing.T) {
		st := openStore(t)
		s := Open(st, Options{Retention: -1})
		defer s.Close()
		if s.Enabled() {
			t.Fatal("enabled with a negative retention")
		}
		s.Put(rec("resp_x", "alice", "", t0, `[]`, `[]`))
		s.Flush()
		if _, err := st.GetResponse("resp_x"); err == nil {
			t.Fatal("stored with a negative retention")
		}
	})
}

// TestIDs: an ID carries its node's tag, which TagOf reads back.
func TestIDs(t *testing.T) {
	st := openStore(t)
	s := Open(st, Options{Node: "server-1"})
	defer s.Close()
	id := s.NewID("0123456789abcdef01234567")
	if !strings.HasPrefix(id, "resp_") || TagOf(id) != NodeTag("server-1") || TagOf(id) == NodeTag("server-2") || s.Tag() != TagOf(id) {
		t.Fatalf("id %s tag %s", id, TagOf(id))
	}
	if TagOf("resp_xyz") != "" || TagOf("msg_0123456789") != "" {
		t.Fatal("a foreign ID has a tag")
	}
}
