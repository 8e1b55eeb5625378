// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// shortSlice is the time slice (ns) a driver and a shim ask the kernel for.
const shortSlice = 100_000

// AskShortSlice asks the kernel for a short time slice (0.1 ms, against a
// default of 0.7 ms times 1 + log2(CPUs): 1.4 ms on 2 cores) for every thread of this process; the threads and
// processes it starts later inherit it. A driver calls it as it starts,
// and a shim as it starts (the engine does not inherit it: see
// engineSlice).
//
// Why: a driver and its shims sleep until a start needs them, then each
// has a few hundred microseconds of work on a cold start's path (the
// plan, the spawn, the spec, the readiness polls). On a busy machine the
// kernel's scheduler (EEVDF, Linux 6.6 and later) lets a task that wakes
// wait behind the running ones for up to their slice: a woken process
// waited 4 ms at the 75th percentile with six busy threads beside it,
// against 0.05 ms with a short slice (2 cores, Linux 6.18). A short slice changes when a task runs, not
// how much: its share of the CPU stays the same. Kernels before 6.12 keep
// their own slice and return no error (the slice is ignored); an error
// (e.g. a seccomp filter refusing sched_setattr) changes nothing.
func AskShortSlice() error {
	return setSlice(0, shortSlice, true)
}

// engineSlice gives the calling thread the kernel's default slice until
// restore, so that the engine it forks meanwhile does not inherit the
// short one: the engine's scheduling is its own. The caller holds its OS
// thread (runtime.LockOSThread) until restore.
func engineSlice() (restore func()) {
	tid := unix.Gettid()
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil || a.Policy != 0 || a.Runtime == 0 {
		return func() {}
	}
	was := a.Runtime
	if setSlice(tid, 0, false) != nil {
		return func() {}
	}
	return func() { _ = setSlice(tid, was, false) }
}

// setSlice sets the slice of tid (every thread of the process for all) to
// ns (0: the kernel's default), keeping each thread's policy and nice;
// only threads of the normal policy are changed.
//
// For all, the threads are listed again until a listing shows none not
// yet set: a thread started by a thread not yet set, after the listing
// before, inherits the old slice; one started by a thread already set
// inherits the new one. Go's runtime settles in a round or two; a
// process that keeps starting threads is given up on after sliceRounds.
func setSlice(tid int, ns uint64, all bool) error {
	if !all {
		return setThreadSlice(tid, ns)
	}
	done := map[int]bool{}
	var last error
	for round := 0; round < sliceRounds; round++ {
		d, err := os.Open("/proc/self/task")
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return err
		}
		fresh := false
		for _, n := range names {
			t, err := strconv.Atoi(n)
			if err != nil || done[t] {
				continue
			}
			done[t], fresh = true, true
			if err := setThreadSlice(t, ns); err != nil {
				last = err
			}
		}
		if !fresh {
			return last
		}
	}
	return last
}

// sliceRounds bounds setSlice's listings of the process's threads.
const sliceRounds = 8

// setThreadSlice sets one thread's slice; a thread of another policy than
// the normal one is left alone.
func setThreadSlice(t int, ns uint64) error {
	a, err := unix.SchedGetAttr(t, 0)
	if err != nil {
		return err
	}
	if a.Policy != 0 { // SCHED_OTHER only: never a real-time or batch thread
		return nil
	}
	a.Size, a.Flags, a.Runtime, a.Deadline, a.Period = unix.SizeofSchedAttr, 0, ns, 0, 0
	return unix.SchedSetAttr(t, a, 0)
}
