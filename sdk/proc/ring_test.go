// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

func TestRing_Tail(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		writes    []string
		n         int
		want      string
		truncated bool
	}{
		{name: "empty", size: 8, n: 4, want: ""},
		{name: "under size", size: 8, writes: []string{"abc"}, n: 10, want: "abc"},
		{name: "tail shorter than held", size: 8, writes: []string{"abcdef"}, n: 2, want: "ef", truncated: true},
		{name: "exactly full", size: 4, writes: []string{"ab", "cd"}, n: 4, want: "abcd"},
		{name: "wrapped", size: 4, writes: []string{"abc", "def"}, n: 10, want: "cdef", truncated: true},
		{name: "one big write", size: 4, writes: []string{"0123456789"}, n: -1, want: "6789", truncated: true},
		{name: "many wraps", size: 5, writes: []string{"ab", "cd", "ef", "gh", "ij", "k"}, n: 3, want: "ijk", truncated: true},
		{name: "all with negative n", size: 8, writes: []string{"xy"}, n: -1, want: "xy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewRing(c.size)
			total := 0
			for _, w := range c.writes {
				n, err := r.Write([]byte(w))
				if err != nil || n != len(w) {
					t.Fatalf("Write = %d, %v", n, err)
				}
				total += n
			}
			got, truncated := r.Tail(c.n)
			if string(got) != c.want || truncated != c.truncated {
				t.Errorf("Tail(%d) = %q, %v; want %q, %v", c.n, got, truncated, c.want, c.truncated)
			}
			if r.Written() != int64(total) {
				t.Errorf("Written = %d, want %d", r.Written(), total)
			}
			if r.Len() != min(total, c.size) {
				t.Errorf("Len = %d", r.Len())
			}
		})
	}
}

func TestRing_Concurrent(t *testing.T) {
	r := NewRing(64)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				_, _ = r.Write([]byte("0123456789\n"))
				r.Tail(20)
			}
		}()
	}
	wg.Wait()
	got, _ := r.Tail(-1)
	if len(got) != 64 || strings.Trim(string(got), "0123456789\n") != "" {
		t.Errorf("Tail = %q", got)
	}
}

// TestRing_StartsSmallAndGrows: a ring takes room as output comes, not its
// whole size at once, and holds the same bytes as one allocated whole,
// across every growth and wrap.
func TestRing_StartsSmallAndGrows(t *testing.T) {
	r := NewRing(RingSize)
	if _, err := r.Write([]byte("engine starting\n")); err != nil {
		t.Fatal(err)
	}
	if got := cap(r.buf); got > ringFirst {
		t.Fatalf("a ring of %d bytes holding 16 took %d bytes at once, want at most %d", RingSize, got, ringFirst)
	}
	for _, size := range []int{1, 3, ringFirst - 1, ringFirst, ringFirst + 1, 3*ringFirst + 7, 8 * ringFirst} {
		r := NewRing(size)
		var all []byte
		rng := rand.New(rand.NewPCG(uint64(size), 7))
		for i := 0; len(all) < 3*size+ringFirst; i++ {
			n := rng.IntN(ringFirst / 2)
			switch i % 7 {
			case 1:
				n = 2*len(r.buf) - r.next // fill a doubled buffer exactly
			case 3:
				n = ringFirst - r.next // fill the buffer exactly
			case 5:
				n = size + 1 // more than the whole ring
			}
			n = max(n, 0)
			p := make([]byte, n)
			for j := range p {
				p[j] = byte(rng.IntN(256))
			}
			all = append(all, p...)
			if m, err := r.Write(p); m != n || err != nil {
				t.Fatalf("Write = %d, %v", m, err)
			}
			want := all[max(0, len(all)-size):]
			got, truncated := r.Tail(-1)
			if !bytes.Equal(got, want) || truncated != (len(all) > size) {
				t.Fatalf("size %d after %d bytes: Tail holds %d bytes (truncated %v), want the last %d", size, len(all), len(got), truncated, len(want))
			}
			if r.Len() != len(want) || len(r.buf) > size {
				t.Fatalf("size %d: Len %d, buffer %d; want %d, at most %d", size, r.Len(), len(r.buf), len(want), size)
			}
		}
	}
}
