// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
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
