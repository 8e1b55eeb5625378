// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package simgpu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// procStat reads a process's start time (field 22 of /proc/<pid>/stat, in
// clock ticks since boot) and its state letter (field 3).
func procStat(pid int) (startTicks uint64, state byte, err error) {
	if pid <= 0 {
		return 0, 0, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseStat(data)
}

// parseStat parses the content of /proc/<pid>/stat. The command name (field
// 2) is in parentheses and may itself hold spaces and parentheses, so the
// fields are counted from the last ')'.
func parseStat(data []byte) (startTicks uint64, state byte, err error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, 0, errors.New("parse stat: no command name")
	}
	fields := bytes.Fields(data[end+1:])
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, errors.New("parse stat: too few fields")
	}
	startTicks, err = strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse stat: start time: %w", err)
	}
	return startTicks, fields[0][0], nil
}

// isDead reports a zombie or dead process: its memory is gone on a real
// card even before its parent reaps it.
func isDead(state byte) bool { return state == 'Z' || state == 'X' }

// ProcessStartTicks returns field 22 of /proc/<pid>/stat, the identity that
// Allocation.StartTicks records, for callers that write allocations for
// another process or compare identities.
func ProcessStartTicks(pid int) (uint64, error) {
	t, _, err := procStat(pid)
	if err != nil {
		return 0, fmt.Errorf("process start ticks: %w", err)
	}
	return t, nil
}
