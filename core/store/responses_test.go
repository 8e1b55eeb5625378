// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func storedResponse(id string, at time.Time, pad int) structs.StoredResponse {
	return structs.StoredResponse{ID: id, Owner: "default", CreatedAt: at,
		Input: []byte(`[{"role":"user","content":"` + strings.Repeat("x", pad) + `"}]`), Response: []byte(`{"id":"` + id + `"}`)}
}

// TestStore_Responses: put, replace, get, delete and the byte count that
// the size bound reads.
func TestStore_Responses(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := storedResponse("resp_a", t0, 10), storedResponse("resp_b", t0.Add(time.Second), 20)
	if err := s.Update(func(tx *Tx) error { return tx.PutResponses([]structs.StoredResponse{a, b}) }); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.ResponseBytes(); n != a.Size()+b.Size() {
		t.Fatalf("bytes = %d, want %d", n, a.Size()+b.Size())
	}
	// A record written again replaces the first, its bytes counted once.
	a2 := storedResponse("resp_a", t0.Add(2*time.Second), 100)
	if err := s.Update(func(tx *Tx) error { return tx.PutResponses([]structs.StoredResponse{a2}) }); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.ResponseBytes(); n != a2.Size()+b.Size() {
		t.Fatalf("bytes after a replace = %d, want %d", n, a2.Size()+b.Size())
	}
	got, err := s.GetResponse("resp_a")
	if err != nil || string(got.Input) != string(a2.Input) || !got.CreatedAt.Equal(a2.CreatedAt) {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if ok, err := s.DeleteResponse("resp_a"); !ok || err != nil {
		t.Fatalf("delete = %v, %v", ok, err)
	}
	if ok, _ := s.DeleteResponse("resp_a"); ok {
		t.Fatal("a second delete found the response")
	}
	wantCode(t, func() error { _, err := s.GetResponse("resp_a"); return err }(), structs.CodeNotFound)
	if n, _ := s.ResponseBytes(); n != b.Size() {
		t.Fatalf("bytes after a delete = %d, want %d", n, b.Size())
	}
	// The age index lost the replaced and the deleted record: only b is
	// left to prune.
	var pruned int
	if err := s.Update(func(tx *Tx) error {
		var err error
		pruned, err = tx.PruneResponses(t0.Add(time.Hour), 0, 100)
		return err
	}); err != nil || pruned != 1 {
		t.Fatalf("prune = %d, %v", pruned, err)
	}
}

// TestStore_PruneResponses: the oldest go first, past the retention or
// the size bound, within the budget.
func TestStore_PruneResponses(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r0 := storedResponse("resp_0", t0, 50)
	one := r0.Size()
	cases := []struct {
		name     string
		cutoff   time.Time
		maxBytes int64
		budget   int
		want     []string // the IDs left
	}{
		{name: "nothing old, no bound", cutoff: t0, want: []string{"resp_0", "resp_1", "resp_2", "resp_3"}},
		{name: "the two oldest past the retention", cutoff: t0.Add(2 * time.Minute), want: []string{"resp_2", "resp_3"}},
		{name: "the size bound keeps the newest", cutoff: t0, maxBytes: 2 * one, want: []string{"resp_2", "resp_3"}},
		{name: "a bound under one record keeps none", cutoff: t0, maxBytes: 1, want: nil},
		{name: "the budget stops it", cutoff: t0.Add(time.Hour), budget: 1, want: []string{"resp_1", "resp_2", "resp_3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newTestStore(t, Options{})
			var recs []structs.StoredResponse
			for i := 0; i < 4; i++ {
				// Inserted newest first: the index orders by time, not by insertion.
				recs = append([]structs.StoredResponse{storedResponse("resp_"+string(rune('0'+i)), t0.Add(time.Duration(i)*time.Minute), 50)}, recs...)
			}
			if err := s.Update(func(tx *Tx) error { return tx.PutResponses(recs) }); err != nil {
				t.Fatal(err)
			}
			budget := c.budget
			if budget == 0 {
				budget = 100
			}
			if err := s.Update(func(tx *Tx) error { _, err := tx.PruneResponses(c.cutoff, c.maxBytes, budget); return err }); err != nil {
				t.Fatal(err)
			}
			var left []string
			for i := 0; i < 4; i++ {
				id := "resp_" + string(rune('0'+i))
				if _, err := s.GetResponse(id); err == nil {
					left = append(left, id)
				}
			}
			if strings.Join(left, ",") != strings.Join(c.want, ",") {
				t.Fatalf("left %v, want %v", left, c.want)
			}
			if n, _ := s.ResponseBytes(); n != int64(len(left))*one {
				t.Fatalf("bytes = %d, want %d", n, int64(len(left))*one)
			}
		})
	}
}
