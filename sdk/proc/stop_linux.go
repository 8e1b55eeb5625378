// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

const (
	// exitRecordWait bounds how long Stop lets the shim record the exit of
	// an engine it killed, before it kills the rest of the group. The wait
	// ends as soon as the record is there; the bound is generous because a
	// loaded machine may take a while to run the shim, and a shim killed
	// before it recorded leaves the exit code unknown (-1).
	exitRecordWait = 5 * time.Second
	// killWait bounds how long Stop waits for the group to disappear after
	// SIGKILL (a process in uninterruptible sleep dies late).
	killWait = 10 * time.Second
)

// Stop ends a launch: SIGTERM to the whole process group, a wait of up to
// grace (polling from 5 ms, growing), then SIGKILL if anything remains, and
// finally proof that no live process is left in the group and that the
// recorded identities are dead. The exit code comes from the shim's exit
// record when there is one.
//
// IMPORTANT: Stop never signals a group it cannot prove is this launch's.
// The shim's PID is the group's ID, so a live shim with the recorded start
// time proves it; so does the recorded engine, alive and still in the
// group. When the shim's PID now names another process (PID reuse), or no
// recorded process is alive while the group still has members, Stop
// signals nothing and returns ErrIdentityMismatch.
//
// Stop returns an error, with Gone false, when processes survive SIGKILL.
func Stop(l Launched, grace time.Duration) (StopResult, error) {
	res := StopResult{ExitCode: -1}
	if l.Pgid <= 1 || l.Pgid == syscall.Getpgrp() {
		return res, fmt.Errorf("stop engine: refusing to signal process group %d", l.Pgid)
	}
	shimSt, shimStat := checkIdentity(l.Shim)
	engSt, engStat := checkIdentity(l.Engine)
	var notes []string
	defer func() { res.Detail = strings.Join(notes, "; ") }()

	if shimSt == identityReused {
		notes = append(notes, fmt.Sprintf("shim pid %d belongs to another process now; nothing signalled", l.Shim.PID))
		res.Gone = groupEmpty(l.Pgid) && engSt != identityMatch
		return res, fmt.Errorf("stop engine: shim pid %d: %w", l.Shim.PID, ErrIdentityMismatch)
	}
	shimOwns := shimSt == identityMatch && shimStat.pgrp == l.Pgid
	engineOwns := engSt == identityMatch && engStat.pgrp == l.Pgid
	if !shimOwns && !engineOwns {
		members := GroupPIDs(l.Pgid)
		if len(members) > 0 || engSt == identityMatch {
			notes = append(notes, fmt.Sprintf("no recorded process is alive in group %d (shim %s, engine %s) but it has members %v; nothing signalled", l.Pgid, shimSt, engSt, members))
			return res, fmt.Errorf("stop engine: cannot prove group %d is this launch's: %w", l.Pgid, ErrIdentityMismatch)
		}
		res.Gone = true
		notes = append(notes, "already gone")
		readExit(&res, l.LaunchDir)
		return res, nil
	}
	if engSt == identityReused {
		// The engine ended long ago and its PID was reused elsewhere; the
		// shim's identity still proves the group is ours. The engine's PID
		// is never signalled on its own.
		notes = append(notes, fmt.Sprintf("engine pid %d was reused by another process", l.Engine.PID))
	}

	gone := func() bool {
		return groupEmpty(l.Pgid) && !Alive(l.Shim) && !Alive(l.Engine)
	}
	if err := syscall.Kill(-l.Pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return res, fmt.Errorf("stop engine: signal group %d: %w", l.Pgid, err)
	}
	notes = append(notes, fmt.Sprintf("sent SIGTERM to group %d", l.Pgid))
	if poll(grace, gone) {
		res.Gone = true
		notes = append(notes, "the group exited within the grace period")
		readExit(&res, l.LaunchDir)
		return res, nil
	}

	res.Forced = true
	notes = append(notes, fmt.Sprintf("grace %s expired", grace))
	// Kill the engine first and let the shim (if still there) record how it
	// ended, then the whole group. The engine is the shim's unreaped child,
	// so its PID cannot have been reused in between.
	if Alive(l.Engine) {
		_ = syscall.Kill(l.Engine.PID, syscall.SIGKILL)
		notes = append(notes, fmt.Sprintf("sent SIGKILL to engine %d", l.Engine.PID))
		if Alive(l.Shim) {
			poll(exitRecordWait, func() bool {
				_, err := readExitRecord(l.LaunchDir)
				return err == nil || !Alive(l.Shim)
			})
		}
	}
	if err := syscall.Kill(-l.Pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return res, fmt.Errorf("stop engine: kill group %d: %w", l.Pgid, err)
	}
	notes = append(notes, fmt.Sprintf("sent SIGKILL to group %d", l.Pgid))
	res.Gone = poll(killWait, func() bool {
		if gone() {
			return true
		}
		_ = syscall.Kill(-l.Pgid, syscall.SIGKILL) // members forked meanwhile
		return false
	})
	readExit(&res, l.LaunchDir)
	if !res.Gone {
		left := GroupPIDs(l.Pgid)
		notes = append(notes, fmt.Sprintf("still alive after SIGKILL: %v", left))
		return res, fmt.Errorf("stop engine: group %d survives SIGKILL (pids %v)", l.Pgid, left)
	}
	notes = append(notes, "the group is gone")
	return res, nil
}

// groupEmpty reports whether no live process is in the group.
func groupEmpty(pgid int) bool { return len(GroupPIDs(pgid)) == 0 }

// readExit fills the exit code and signal from the launch's exit record.
func readExit(res *StopResult, dir string) {
	if dir == "" {
		return
	}
	if rec, err := readExitRecord(dir); err == nil {
		res.ExitCode, res.Signal = rec.Code, rec.Signal
	}
}

// poll calls cond until it returns true or d has passed, waiting 5 ms at
// first and half as long again each time, up to 100 ms. It reports whether
// cond became true.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	interval := 5 * time.Millisecond
	for {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(interval, left))
		interval = min(interval*3/2, 100*time.Millisecond)
	}
}
