// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"testing"
)

// TestParseJournal_ABadLineHidesNothingAfterIt: a bad line within the
// journal (a failed append whose cut failed too) is skipped; the whole
// lines after it are read, and a torn last line is ignored.
func TestParseJournal_ABadLineHidesNothingAfterIt(t *testing.T) {
	data := []byte(`1 {"id":"a-0","deployment":"a"}
2 {"id":"a-1","deploym
3 {"id":"a-2","deployment":"a"}
x {"id":"a-3"}
5 {"id":"b-0","deployment":"b"}
6 {"id":"b-1","dep`)
	got := parseJournal(data)
	var seqs []string
	for _, e := range got {
		seqs = append(seqs, fmt.Sprintf("%d:%s", e.seq, e.deployment))
	}
	if fmt.Sprint(seqs) != "[1:a 3:a 5:b]" {
		t.Fatalf("parsed %v, want [1:a 3:a 5:b]", seqs)
	}
}
