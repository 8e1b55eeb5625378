// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procRoot is where /proc is mounted.
const procRoot = "/proc"

// statInfo is what the package reads from /proc/<pid>/stat.
type statInfo struct {
	state      byte
	ppid       int
	pgrp       int
	session    int
	startTicks uint64
}

// dead reports whether the process has terminated (a zombie waiting to be
// reaped, or already dead).
func (s statInfo) dead() bool { return s.state == 'Z' || s.state == 'X' || s.state == 'x' }

// readStat parses /proc/<pid>/stat. The command name (field 2) may contain
// spaces and parentheses, so the fields are counted from the last ')'.
//
// The file is read with one open, one read and one close into a buffer on
// the stack: a scan of the process table (GroupPIDs, Descendants) reads
// every process's, and it is on a cold start's path (the off-loopback check
// when the engine is ready). os.ReadFile costs twice the system calls (its
// stat, the poller's registration, the read to end of file): a scan of 138
// processes took 2.2-4.7 ms that way against 1.4-2.1 ms, on a busy 2-core
// machine. A line longer than the buffer is read again whole.
func readStat(pid int) (statInfo, error) {
	if pid <= 0 {
		return statInfo{}, fmt.Errorf("read stat: invalid pid %d", pid)
	}
	var buf [statBufSize]byte
	return readStatInto(pid, buf[:])
}

// readStatInto is readStat reading into buf first.
func readStatInto(pid int, buf []byte) (statInfo, error) {
	path := procRoot + "/" + strconv.Itoa(pid) + "/stat"
	n, err := readSmall(path, buf)
	if err != nil {
		return statInfo{}, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	if n < len(buf) {
		return parseStat(buf[:n])
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return statInfo{}, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	return parseStat(b)
}

// statBufSize holds a stat line (about 300 bytes; 52 fields of at most 20
// digits and a 16-byte name stay under 1,200).
const statBufSize = 2048

// readSmall reads up to len(buf) bytes of a file in one read(2).
func readSmall(path string, buf []byte) (int, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	for {
		n, err := syscall.Read(fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, &os.PathError{Op: "read", Path: path, Err: err}
		}
		return n, nil
	}
}

// parseStat parses the content of a /proc/<pid>/stat file.
func parseStat(b []byte) (statInfo, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return statInfo{}, errors.New("parse stat: no command name")
	}
	// fields[0] is field 3 (state), so field N is fields[N-3].
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 || len(fields[0]) != 1 {
		return statInfo{}, errors.New("parse stat: too few fields")
	}
	var s statInfo
	var err error
	s.state = fields[0][0]
	if s.ppid, err = strconv.Atoi(fields[1]); err != nil {
		return statInfo{}, fmt.Errorf("parse stat ppid: %w", err)
	}
	if s.pgrp, err = strconv.Atoi(fields[2]); err != nil {
		return statInfo{}, fmt.Errorf("parse stat pgrp: %w", err)
	}
	if s.session, err = strconv.Atoi(fields[3]); err != nil {
		return statInfo{}, fmt.Errorf("parse stat session: %w", err)
	}
	if s.startTicks, err = strconv.ParseUint(fields[19], 10, 64); err != nil {
		return statInfo{}, fmt.Errorf("parse stat starttime: %w", err)
	}
	return s, nil
}

// ReadStartTicks returns the start time of a process in clock ticks since
// boot (field 22 of /proc/<pid>/stat). With the PID it identifies a process
// across PID reuse.
func ReadStartTicks(pid int) (uint64, error) {
	s, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return s.startTicks, nil
}

// Alive reports whether the process id names exists, has the recorded start
// ticks and is not a zombie.
func Alive(id Identity) bool {
	s, err := readStat(id.PID)
	if err != nil {
		return false
	}
	return s.startTicks == id.StartTicks && !s.dead()
}

// identityState is what /proc says about a recorded identity.
type identityState int

const (
	// identityGone: no live process has the PID (absent or a zombie).
	identityGone identityState = iota
	// identityMatch: the recorded process is alive.
	identityMatch
	// identityReused: a live process has the PID but another start time.
	identityReused
)

func (s identityState) String() string {
	switch s {
	case identityMatch:
		return "alive"
	case identityReused:
		return "pid reused"
	default:
		return "gone"
	}
}

// checkIdentity classifies a recorded identity and returns the process's
// stat when it is alive.
func checkIdentity(id Identity) (identityState, statInfo) {
	if id.PID <= 0 {
		return identityGone, statInfo{}
	}
	s, err := readStat(id.PID)
	if err != nil || s.dead() {
		return identityGone, s
	}
	if s.startTicks != id.StartTicks {
		return identityReused, s
	}
	return identityMatch, s
}

// scanProcs calls fn for every process in /proc with its parsed stat.
// Processes that vanish during the scan are skipped.
func scanProcs(fn func(pid int, s statInfo)) {
	d, err := os.Open(procRoot)
	if err != nil {
		return
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return
	}
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		s, err := readStat(pid)
		if err != nil {
			continue
		}
		fn(pid, s)
	}
}

// GroupPIDs returns every live (not zombie) process whose process group is
// pgid, in ascending order. It returns nil for pgid <= 0.
func GroupPIDs(pgid int) []int {
	return NewGroup(pgid).PIDs()
}

// Group follows the live members of one process group from read to read.
// The first read, and a read more than groupRescan after the one before,
// reads every process's stat (a few milliseconds on a busy machine); the
// others read /proc's list of processes and the stat of only the ones
// started since the read before and of the group's members then. So a
// process the group started since is seen, even one orphaned at once (a
// double fork: its PID is new), and so is a member that left or died.
//
// IMPORTANT: what a later read does not see: a process that was alive
// outside the group at the read before and has moved into the group since
// (setpgid into a group of another process tree in the same session: code
// written for it, in another process of the driver's session), and a new
// member that took the PID of a process that ended since the read before
// (pid_max processes started between two reads). Drivers read a launch's
// group every 50-250 ms while it starts, never more than groupRescan
// apart without a full read.
type Group struct {
	pgid    int
	known   map[int]bool // the processes alive outside the group at the last read
	members []int
	at      time.Time
}

// groupRescan is how old a Group's last read may be for the next to read
// only what changed.
const groupRescan = time.Second

// statOf reads a process's stat (a test counts the reads).
var statOf = readStat

// NewGroup returns the Group of pgid; it reads nothing yet.
func NewGroup(pgid int) *Group { return &Group{pgid: pgid} }

// PIDs returns the group's live (not zombie) members in ascending order,
// nil for pgid <= 0.
func (g *Group) PIDs() []int {
	if g.pgid <= 0 {
		return nil
	}
	names, err := procPIDs()
	if err != nil {
		return nil
	}
	now := time.Now()
	full := g.known == nil || now.Sub(g.at) > groupRescan
	known := make(map[int]bool, len(names))
	var members []int
	for _, pid := range names {
		if !full && g.known[pid] {
			known[pid] = true // alive outside the group at the last read
			continue
		}
		s, err := statOf(pid)
		if err != nil {
			continue // gone: its PID counts as new if it comes back
		}
		if s.pgrp == g.pgid && !s.dead() {
			members = append(members, pid)
		} else {
			known[pid] = true
		}
	}
	sort.Ints(members)
	g.known, g.members, g.at = known, members, now
	return members
}

// procPIDs lists the processes in /proc.
func procPIDs() ([]int, error) {
	d, err := os.Open(procRoot)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(name); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Descendants returns the live descendants of pid (children, grandchildren
// and so on, not pid itself), found by walking the parent links of
// /proc/*/stat. Processes that were re-parented away (daemonized) are not
// descendants any more.
func Descendants(pid int) []int {
	children := map[int][]int{}
	scanProcs(func(p int, s statInfo) {
		if !s.dead() {
			children[s.ppid] = append(children[s.ppid], p)
		}
	})
	var out []int
	queue := []int{pid}
	seen := map[int]bool{pid: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if seen[c] {
				continue
			}
			seen[c] = true
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	sort.Ints(out)
	return out
}

// ProcessName returns the command name of pid (/proc/<pid>/comm), or "" when
// the process does not exist.
func ProcessName(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimRight(string(b), "\n")
}

// TreeMemory returns the resident memory of pid and all its descendants:
// the sum of VmRSS, and the sum of each process's VmHWM (its own peak; the
// peaks may not have coincided, so hwm bounds the tree's peak from above).
// Both are in bytes. Kernel threads and processes that vanish during the
// walk count as zero. The error is set only when pid itself cannot be read.
func TreeMemory(pid int) (rss int64, hwm int64, err error) {
	r, h, err := readStatusMemory(pid)
	if err != nil {
		return 0, 0, fmt.Errorf("tree memory: %w", err)
	}
	rss, hwm = r, h
	for _, p := range Descendants(pid) {
		r, h, err := readStatusMemory(p)
		if err != nil {
			continue
		}
		rss += r
		hwm += h
	}
	return rss, hwm, nil
}

// readStatusMemory reads VmRSS and VmHWM (in bytes) from /proc/<pid>/status.
func readStatusMemory(pid int) (rss, hwm int64, err error) {
	if pid <= 0 {
		return 0, 0, fmt.Errorf("invalid pid %d", pid)
	}
	f, err := os.Open(procRoot + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			rss = parseKB(line[len("VmRSS:"):])
		case strings.HasPrefix(line, "VmHWM:"):
			hwm = parseKB(line[len("VmHWM:"):])
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	return rss, hwm, nil
}

// parseKB parses "   1234 kB" into bytes; 0 when malformed.
func parseKB(s string) int64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0
	}
	if len(f) > 1 && f[1] == "kB" {
		n *= 1024
	}
	return n
}

// CoreFileLimit returns a process's soft and hard "Max core file size" as
// /proc/<pid>/limits writes them ("0", "unlimited").
func CoreFileLimit(pid int) (soft, hard string, err error) {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return "", "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Max core file size"); ok {
			if f := strings.Fields(rest); len(f) >= 2 {
				return f[0], f[1], nil
			}
		}
	}
	return "", "", fmt.Errorf("no core file limit in /proc/%d/limits", pid)
}
