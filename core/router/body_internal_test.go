// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// trickle yields its data a few bytes a read, then fails with err (io.EOF
// for a body that ends).
type trickle struct {
	data string
	step int
	err  error
}

func (r *trickle) Read(p []byte) (int, error) {
	if r.data == "" {
		return 0, r.err
	}
	n := min(r.step, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

var errStalled = errors.New("stalled")

func TestReadGrowing(t *testing.T) {
	cases := []struct {
		name     string
		sent     int
		declared int64
		max      int64
		end      error
		budget   int64
		maxHeld  int64 // the buffer never takes more
		wantErr  error
		wantLen  int
	}{
		{"10 bytes of 32 MiB announced, then a stall", 10, 32 << 20, 64 << 20, errStalled, 1 << 30, firstBodyBuffer, errStalled, 0},
		{"small body, exact buffer", 100, 100, 64 << 20, io.EOF, 1 << 30, 100, nil, 100},
		{"an empty body announced takes no buffer", 0, 0, 64 << 20, io.EOF, 1 << 30, 0, nil, 0},
		{"1 MiB announced and sent", 1 << 20, 1 << 20, 64 << 20, io.EOF, 1 << 30, 1 << 20, nil, 1 << 20},
		{"unknown length grows by doubling", 100 << 10, -1, 64 << 20, io.EOF, 1 << 30, 128 << 10, nil, 100 << 10},
		{"unknown length over max stops one byte over", 10 << 10, -1, 4 << 10, io.EOF, 1 << 30, 4<<10 + 1, nil, 4<<10 + 1},
		{"over the budget", 100 << 10, -1, 64 << 20, io.EOF, 40 << 10, 32 << 10, errBodiesFull, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &bodyBudget{limit: c.budget}
			src := &trickle{data: strings.Repeat("x", c.sent), step: 1000, err: c.end}
			buf, held, err := readGrowing(src, c.declared, c.max, b)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("error %v, want %v", err, c.wantErr)
			}
			if held > c.maxHeld || b.held.Load() != held {
				t.Fatalf("held %d (budget says %d), want at most %d", held, b.held.Load(), c.maxHeld)
			}
			if len(buf) != c.wantLen || int64(cap(buf)) > held {
				t.Fatalf("buffer len %d cap %d (held %d), want len %d", len(buf), cap(buf), held, c.wantLen)
			}
			b.give(held)
		})
	}
}

// TestBodyBudget_Edges: the limit and the small bodies' reserve hold at
// their exact edges.
func TestBodyBudget_Edges(t *testing.T) {
	b := &bodyBudget{limit: 1600} // reserve 100
	if !b.fits(1600) || b.fits(1601) {
		t.Fatal("an empty budget: the limit is not exactly 1600")
	}
	if !b.takeFor(1600, 1600) {
		t.Fatal("the whole limit was refused")
	}
	if !b.fits(100) || b.fits(101) {
		t.Fatal("a full budget: the reserve does not take exactly 100")
	}
	if b.takeFor(101, 101) || !b.takeFor(100, 100) {
		t.Fatal("a full budget: the reserve's edge")
	}
	if b.takeFor(1, 1) {
		t.Fatal("the reserve gave more than its share")
	}
	b.give(1700)
	if n := b.held.Load(); n != 0 {
		t.Fatalf("held %d after giving everything back", n)
	}
}
