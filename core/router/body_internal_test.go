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
