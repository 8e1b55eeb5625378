// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ports

import (
	"os"
	"syscall"
)

// flockHeld reports whether another open file description holds f's lock.
func flockHeld(f *os.File) bool {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
