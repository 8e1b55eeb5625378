// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engine

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestShm_Clean(t *testing.T) {
	dir := t.TempDir()
	launch := t.TempDir()
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	older := mk("sglang_loads_old.shm")
	foreign := mk("other_segment")
	s := Shm{Dir: dir, LaunchDir: launch, Prefixes: []string{"sglang_"}}
	if err := s.RecordBefore(); err != nil {
		t.Fatal(err)
	}
	made := mk("sglang_loads_new.shm")
	seen := mk("psm_1234")
	held := mk("sglang_loads_held.shm")

	// A process of the launch holds seen; another process holds held.
	holder := exec.Command("sleep", "60")
	f, err := os.Open(seen)
	if err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	holder.ExtraFiles = []*os.File{f}
	other := exec.Command("sleep", "60")
	other.ExtraFiles = []*os.File{g}
	if err := holder.Start(); err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	g.Close()
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	s.Observe([]int{holder.Process.Pid})
	holder.Process.Kill()
	holder.Wait()

	removed := s.Clean()
	want := []string{seen, made} // sorted
	if strings.Join(removed, ",") != strings.Join(want, ",") {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, p := range []string{older, foreign, held} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

func TestReleaseAtLeast(t *testing.T) {
	cases := []struct {
		release, min []int
		want         bool
	}{
		{[]int{0, 7, 0}, []int{0, 7, 0}, true},
		{[]int{0, 7}, []int{0, 7, 0}, true},
		{[]int{0, 7, 1}, []int{0, 7}, true},
		{[]int{0, 6, 9}, []int{0, 7}, false},
		{[]int{1}, []int{0, 7, 0}, true},
		{nil, []int{0, 1}, false},
	}
	for _, c := range cases {
		if got := ReleaseAtLeast(c.release, c.min); got != c.want {
			t.Errorf("ReleaseAtLeast(%v, %v) = %v, want %v", c.release, c.min, got, c.want)
		}
	}
}
