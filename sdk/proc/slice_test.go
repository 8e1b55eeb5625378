// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// threadSlices returns se.slice (ns) of every thread of pid.
func threadSlices(t *testing.T, pid int) map[int]uint64 {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint64{}
	for _, e := range ents {
		f, err := os.Open(dir + "/" + e.Name() + "/sched")
		if err != nil {
			continue // the thread ended
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			name, val, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(name) == "se.slice" {
				v, _ := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
				tid, _ := strconv.Atoi(e.Name())
				out[tid] = v
			}
		}
		f.Close()
	}
	return out
}

// TestStart_ShortSliceForTheShimNotTheEngine: a shim's threads run with a
// short time slice (quick to wake on a busy machine); the engine it forks
// gets the kernel's default, whatever its shim and driver ask for.
func TestStart_ShortSliceForTheShimNotTheEngine(t *testing.T) {
	if len(threadSlices(t, os.Getpid())) == 0 {
		t.Skip("this kernel shows no se.slice in /proc/<pid>/task/<tid>/sched (before Linux 6.6)")
	}
	// As a driver does: its spare shims inherit the slice.
	// Before Linux 6.12 the kernel takes the call and ignores the slice:
	// whether it took is read back, not told by the call.
	err := AskShortSlice()
	took := false
	for _, s := range threadSlices(t, os.Getpid()) {
		took = took || s == shortSlice
	}
	if !took {
		t.Skipf("this kernel keeps its own slice for a normal thread (before Linux 6.12; sched_setattr said %v)", err)
	}
	l := startEngine(t, engineSpec(t, "", nil))
	waitTail(t, l.LaunchDir, "ready")
	shim := threadSlices(t, l.Shim.PID)
	for tid, s := range shim {
		if s != shortSlice {
			t.Errorf("shim thread %d: slice %d ns, want %d", tid, s, shortSlice)
		}
	}
	engine := threadSlices(t, l.Engine.PID)
	if len(shim) == 0 || len(engine) == 0 {
		t.Fatalf("no threads read: shim %v, engine %v", shim, engine)
	}
	for tid, s := range engine {
		if s == shortSlice {
			t.Errorf("engine thread %d: the shim's short slice (%d ns), want the kernel's default", tid, s)
		}
	}
}
