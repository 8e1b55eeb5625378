// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package poll waits in tests for a condition that something else makes
// true (a process, a goroutine, a server), instead of sleeping for a
// guessed time. It has no dependencies, so any test package may use it.
package poll

import (
	"testing"
	"time"
)

// Until calls cond until it holds, first every millisecond and then less
// often (up to every 50 ms), and fails t naming what it waited for when
// timeout passes first. Pick a timeout generous enough for a loaded
// machine: it bounds a failure, it is never a figure.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	until(t, timeout, 50*time.Millisecond, what, cond)
}

// UntilSlow is Until for a condition that costs a request or a process to
// check (a role's status, a CLI command): it backs off up to every 200 ms.
func UntilSlow(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	until(t, timeout, 200*time.Millisecond, what, cond)
}

func until(t testing.TB, timeout, most time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
		if interval < most {
			interval = min(2*interval, most)
		}
	}
}
