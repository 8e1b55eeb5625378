// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// DisableCoreDumps keeps the calling process out of core files and out of
// other users' reach through /proc and ptrace: the core-file size limit
// becomes 0 (soft and hard, so it cannot be raised again) and the process
// is marked not dumpable (PR_SET_DUMPABLE 0). The role and every driver
// call it at start: they hold the API key, the admin token and every
// engine's key. The limit is inherited by children (launch shims and
// engines); dumpability is reset by execve, which is why engines get the
// limit (LaunchSpec.NoCoreDumps) rather than this call.
func DisableCoreDumps() error {
	var errs []error
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: 0, Max: 0}); err != nil {
		errs = append(errs, fmt.Errorf("set the core-file limit to 0: %w", err))
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		errs = append(errs, fmt.Errorf("mark the process not dumpable: %w", err))
	}
	return errors.Join(errs...)
}

// Dumpable reports the calling process's PR_GET_DUMPABLE flag.
func Dumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	return v != 0, err
}
