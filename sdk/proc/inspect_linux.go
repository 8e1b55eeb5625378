// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import "fmt"

// Inspect says what /proc shows of a recorded launch, without touching it:
// what a driver's Recover and liveness probe need after a restart.
func Inspect(l Launched) (LaunchState, string) {
	engSt, _ := checkIdentity(l.Engine)
	if engSt == identityMatch {
		return LaunchRunning, fmt.Sprintf("engine %d is alive", l.Engine.PID)
	}
	shimSt, shimStat := checkIdentity(l.Shim)
	if shimSt == identityMatch && shimStat.pgrp == l.Pgid {
		return LaunchExited, fmt.Sprintf("engine %d is %s; shim %d still holds group %d", l.Engine.PID, engSt, l.Shim.PID, l.Pgid)
	}
	members := GroupPIDs(l.Pgid)
	if shimSt == identityReused || len(members) == 0 {
		// The shim stays while its group has members, so a dead shim and
		// an empty group (or a reused shim PID, which the kernel does not
		// hand out while the group exists) mean nothing of the launch is
		// left.
		return LaunchGone, fmt.Sprintf("engine %d is %s, shim %d is %s", l.Engine.PID, engSt, l.Shim.PID, shimSt)
	}
	return LaunchUncertain, fmt.Sprintf("engine %d is %s and shim %d is %s, but group %d has members %v", l.Engine.PID, engSt, l.Shim.PID, shimSt, l.Pgid, members)
}
