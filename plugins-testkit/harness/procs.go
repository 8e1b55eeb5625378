// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
)

func actionStop() wire.ActionRequest { return wire.ActionRequest{Action: "stop", Wait: true} }

// Leftovers returns the live processes that belong to a state directory:
// their working directory is under it (engines run in their launch
// directories) or their environment names it (drivers log under it).
func Leftovers(stateDir string) []int {
	stateDir = filepath.Clean(stateDir)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if zombie(pid) {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil {
			if cwd == stateDir || strings.HasPrefix(cwd, stateDir+"/") {
				out = append(out, pid)
				continue
			}
		}
		if env, err := os.ReadFile("/proc/" + e.Name() + "/environ"); err == nil {
			if strings.Contains(string(env), stateDir+"/") {
				out = append(out, pid)
			}
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// KillLeftovers kills the process groups of every leftover process.
func KillLeftovers(stateDir string) {
	for attempt := 0; attempt < 3; attempt++ {
		pids := Leftovers(stateDir)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			if pgid, err := syscall.Getpgid(pid); err == nil && pgid > 1 && pgid != syscall.Getpgrp() {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lockedWriter is a goroutine-safe buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  interface {
		Write([]byte) (int, error)
		String() string
	}
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// DriverPIDs returns the live driver processes of a family that belong to
// a state directory.
func DriverPIDs(stateDir, family string) []int {
	var out []int
	for _, pid := range Leftovers(stateDir) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) >= 3 && args[len(args)-2] == "driver" && args[len(args)-1] == family {
			out = append(out, pid)
		}
	}
	return out
}

// EnginePIDs returns the live processes running in launch directories of a
// state directory (engines and their supervisors).
func EnginePIDs(stateDir string) []int {
	stateDir = filepath.Clean(stateDir)
	var out []int
	for _, pid := range Leftovers(stateDir) {
		if cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); err == nil && strings.HasPrefix(cwd, stateDir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// Alive reports whether a process exists and is not a zombie.
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	return !zombie(pid)
}

// ProgramPIDs returns the live processes of a state directory that run
// program with no arguments: a third-party driver (capyctl-driver-<name>),
// not the launch shims it re-executes itself as. A child the driver has
// forked but not yet executed as a shim still reads as the driver (same
// command line); it is left out by its parent, which is a match itself.
func ProgramPIDs(stateDir, program string) []int {
	matched := map[int]bool{}
	var found []int
	for _, pid := range Leftovers(stateDir) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 1 && filepath.Base(args[0]) == program {
			matched[pid] = true
			found = append(found, pid)
		}
	}
	var out []int
	for _, pid := range found {
		if !matched[parentPID(pid)] {
			out = append(out, pid)
		}
	}
	return out
}

// parentPID reads a process's parent from /proc (0 when it is gone).
func parentPID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}
