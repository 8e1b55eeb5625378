// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sysmonpace

import (
	"os"
	"runtime"
	"syscall"
)

// Settle re-executes this binary with Setting when args start a role and
// it is not set yet; it returns when there is nothing to do, or when the
// re-execution failed (the role then starts with the runtime's default).
// Call it first in main, before any goroutine or file of the role exists.
func Settle(args []string) {
	if restore() || !Wants(args) || runtime.GOMAXPROCS(0) < 2 {
		return
	}
	env, ok := reexecEnv(os.Environ())
	if !ok {
		return
	}
	// /proc/self/exe: the binary itself, even when args[0] is a bare name
	// or the file was replaced since.
	_ = syscall.Exec("/proc/self/exe", args, env)
}
