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
	// The binary's path, not /proc/self/exe: the kernel names a process
	// after the file it was executed from, and ps, pgrep and journald
	// know a role as capyctl. A binary replaced or removed since the
	// start fails here, and the role starts with the runtime's default.
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, args, env)
}
