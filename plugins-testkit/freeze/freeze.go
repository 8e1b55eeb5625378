// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package freeze stops a process with SIGSTOP for a test and returns once
// the process is really stopped. kill(2) only queues the signal: each
// thread stops the next time it leaves the kernel, and on a loaded machine
// a thread of the target can still run for milliseconds after kill
// returned, long enough to answer one more request. A test that means "this
// process hangs from now on" waits for every thread to read stopped in
// /proc before it goes on. It has no dependencies, so any test package may
// use it.
package freeze

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Process sends SIGSTOP to pid and waits until every thread of it is
// stopped, failing t when that takes longer than a minute (a bound for a
// loaded machine, never a figure).
func Process(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP to %d: %v", pid, err)
	}
	deadline := time.Now().Add(time.Minute)
	for !Stopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still has a running thread a minute after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// Stopped reports whether every thread of pid is in the stopped state
// (T, or t under a tracer). A process that is gone is not stopped.
func Stopped(pid int) bool {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil || !stoppedState(string(b)) {
			return false
		}
	}
	return true
}

// stoppedState reads the state field of a /proc stat line: the first
// field after the command, which is in parentheses and may itself hold
// spaces and parentheses.
func stoppedState(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state == 'T' || state == 't'
}
