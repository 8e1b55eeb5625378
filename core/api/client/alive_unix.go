// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package client

import "syscall"

// processAlive reports whether a PID exists (signal 0).
func processAlive(pid int) error {
	err := syscall.Kill(pid, 0)
	if err == syscall.EPERM {
		return nil
	}
	return err
}
