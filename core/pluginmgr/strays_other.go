// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package pluginmgr

// environ is a process and its environment.
type environ struct{ pid int }

func (environ) has(string) bool { return false }

// environs finds nothing outside Linux (no /proc).
func environs(string) []environ { return nil }
