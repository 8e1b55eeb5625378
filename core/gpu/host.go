// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// HostFS says where the kernel's files are (tests point it at testdata).
type HostFS struct {
	// ProcRoot is /proc.
	ProcRoot string
	// CgroupRoot is where the cgroup hierarchy is mounted (/sys/fs/cgroup).
	CgroupRoot string
}

// DefaultHostFS is the running machine's.
var DefaultHostFS = HostFS{ProcRoot: "/proc", CgroupRoot: "/sys/fs/cgroup"}

// HostMemory is the host's RAM as the role may use it.
type HostMemory struct {
	// TotalBytes and AvailableBytes are /proc/meminfo's MemTotal and
	// MemAvailable.
	TotalBytes     int64 `json:"total_bytes"`
	AvailableBytes int64 `json:"available_bytes"`
	// CgroupPath is the role's own cgroup ("/user.slice/…/user@1000.service/…").
	CgroupPath string `json:"cgroup_path,omitempty"`
	// CgroupLimit is the tightest memory.max on the way from the role's
	// cgroup to the root (v1: memory.limit_in_bytes), 0 when unlimited.
	CgroupLimit int64 `json:"cgroup_limit_bytes,omitempty"`
	// CgroupUsage is the role's cgroup's memory.current, when limited.
	CgroupUsage int64 `json:"cgroup_usage_bytes,omitempty"`
}

// Capacity is the RAM the role may use: MemTotal, bounded by the cgroup.
func (h HostMemory) Capacity() int64 {
	if h.CgroupLimit > 0 && h.CgroupLimit < h.TotalBytes {
		return h.CgroupLimit
	}
	return h.TotalBytes
}

// Available is what is free now: MemAvailable, bounded by what the cgroup
// has left.
func (h HostMemory) Available() int64 {
	a := h.AvailableBytes
	if h.CgroupLimit > 0 {
		if left := h.CgroupLimit - h.CgroupUsage; left < a {
			a = max(left, 0)
		}
	}
	return a
}

// ReadHostMemory reads /proc/meminfo and the memory limit of the calling
// process's cgroup: cgroup v2 (the "0::<path>" line of /proc/self/cgroup,
// memory.max of that cgroup and each parent), else v1 (memory.limit_in_bytes
// of the memory controller's cgroup). Cgroup names are taken as they are,
// '@' included (user@1000.service, capyctl@host.service).
func (fsys HostFS) ReadHostMemory() (HostMemory, error) {
	var h HostMemory
	mi, err := os.ReadFile(filepath.Join(fsys.ProcRoot, "meminfo"))
	if err != nil {
		return h, fmt.Errorf("read host memory: %w", err)
	}
	h.TotalBytes, h.AvailableBytes = parseMeminfo(mi)
	if h.TotalBytes <= 0 {
		return h, fmt.Errorf("read host memory: %s has no MemTotal", filepath.Join(fsys.ProcRoot, "meminfo"))
	}
	cg, err := os.ReadFile(filepath.Join(fsys.ProcRoot, "self", "cgroup"))
	if err != nil {
		return h, nil // no cgroup information: the machine's RAM
	}
	v2, v1 := parseProcCgroup(cg)
	if v2 != "" {
		h.CgroupPath = v2
		h.CgroupLimit, h.CgroupUsage = fsys.cgroupV2Limit(v2)
	}
	// A hybrid machine lists "0::/" beside the v1 controllers: the memory
	// limit then lives in v1.
	if h.CgroupLimit == 0 && v1 != "" {
		if limit, usage := fsys.cgroupV1Limit(v1); limit > 0 {
			h.CgroupPath, h.CgroupLimit, h.CgroupUsage = v1, limit, usage
		}
	}
	if h.CgroupLimit == 0 {
		h.CgroupUsage = 0
	}
	return h, nil
}

// parseMeminfo returns MemTotal and MemAvailable in bytes.
func parseMeminfo(b []byte) (total, avail int64) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "MemTotal:"):
			total = parseKB(line[len("MemTotal:"):])
		case strings.HasPrefix(line, "MemAvailable:"):
			avail = parseKB(line[len("MemAvailable:"):])
		}
	}
	return total, avail
}

// parseProcCgroup returns the v2 path ("0::/a/b") and the v1 memory
// controller's path ("4:memory:/a/b"). Only the first two colons split a
// line: a path may hold anything but a newline.
func parseProcCgroup(b []byte) (v2, v1 string) {
	for _, line := range strings.Split(string(b), "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		ctrls, p, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(p, "/") {
			continue
		}
		if id == "0" && ctrls == "" {
			v2 = p
			continue
		}
		for _, c := range strings.Split(ctrls, ",") {
			if c == "memory" {
				v1 = p
			}
		}
	}
	return v2, v1
}

// cleanCgroupPath refuses a path that would leave the hierarchy.
func cleanCgroupPath(p string) (string, bool) {
	if !strings.HasPrefix(p, "/") {
		return "", false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", false
		}
	}
	return path.Clean(p), true
}

// cgroupV2Limit walks from the cgroup to the root and returns the smallest
// memory.max (0 when every level says "max") and the cgroup's
// memory.current. A cgroup namespace shows "/" while the limit sits on the
// mount's root: the root's own memory.max is read too.
func (fsys HostFS) cgroupV2Limit(p string) (limit, usage int64) {
	p, ok := cleanCgroupPath(p)
	if !ok {
		return 0, 0
	}
	first := true
	for {
		dir := filepath.Join(fsys.CgroupRoot, filepath.FromSlash(p))
		if v, ok := readCgroupValue(filepath.Join(dir, "memory.max")); ok && v > 0 && (limit == 0 || v < limit) {
			limit = v
		}
		if first {
			if v, ok := readCgroupValue(filepath.Join(dir, "memory.current")); ok {
				usage = v
			}
			first = false
		}
		if p == "/" {
			break
		}
		p = path.Dir(p)
	}
	return limit, usage
}

// cgroupV1Limit reads memory.limit_in_bytes of the memory controller's
// cgroup (or of the mount's root, inside a namespace). Values of 2^62 and
// above mean unlimited.
func (fsys HostFS) cgroupV1Limit(p string) (limit, usage int64) {
	p, ok := cleanCgroupPath(p)
	if !ok {
		return 0, 0
	}
	for _, dir := range []string{filepath.Join(fsys.CgroupRoot, "memory", filepath.FromSlash(p)), filepath.Join(fsys.CgroupRoot, "memory")} {
		v, ok := readCgroupValue(filepath.Join(dir, "memory.limit_in_bytes"))
		if !ok {
			continue
		}
		if v >= 1<<62 {
			return 0, 0
		}
		u, _ := readCgroupValue(filepath.Join(dir, "memory.usage_in_bytes"))
		return v, u
	}
	return 0, 0
}

// readCgroupValue reads a number of bytes; "max" reads as 0 (no limit).
func readCgroupValue(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	if v > math.MaxInt64 {
		return 0, true
	}
	return int64(v), true
}

// parseKB parses "   1234 kB" into bytes; 0 when malformed.
func parseKB(s string) int64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	if len(f) > 1 && f[1] == "kB" {
		n *= 1024
	}
	return n
}

// ProcessInfo is one process of the process table.
type ProcessInfo struct {
	PID  int
	PPID int
	PGID int
	// Comm is the command name (/proc/<pid>/comm, at most 15 bytes).
	Comm string
	// StartTicks is field 22 of /proc/<pid>/stat.
	StartTicks uint64
}

// Processes reads the process table (live processes only; zombies and
// processes that vanish during the scan are left out).
func (fsys HostFS) Processes() []ProcessInfo {
	d, err := os.Open(fsys.ProcRoot)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil
	}
	out := make([]ProcessInfo, 0, len(names))
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(fsys.ProcRoot, name, "stat"))
		if err != nil {
			continue
		}
		p, err := parseStat(pid, b)
		if err != nil {
			continue
		}
		out = append(out, p)
	}
	return out
}

// errDead is a zombie or dead process.
var errDead = errors.New("process is dead")

// parseStat parses /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStat(pid int, b []byte) (ProcessInfo, error) {
	open := bytes.IndexByte(b, '(')
	i := bytes.LastIndexByte(b, ')')
	if open < 0 || i < open {
		return ProcessInfo{}, errors.New("stat: no command name")
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 || len(fields[0]) != 1 {
		return ProcessInfo{}, errors.New("stat: too few fields")
	}
	switch fields[0][0] {
	case 'Z', 'X', 'x':
		return ProcessInfo{}, errDead
	}
	p := ProcessInfo{PID: pid, Comm: string(b[open+1 : i])}
	var err error
	if p.PPID, err = strconv.Atoi(fields[1]); err != nil {
		return ProcessInfo{}, err
	}
	if p.PGID, err = strconv.Atoi(fields[2]); err != nil {
		return ProcessInfo{}, err
	}
	if p.StartTicks, err = strconv.ParseUint(fields[19], 10, 64); err != nil {
		return ProcessInfo{}, err
	}
	return p, nil
}

// startTicks returns a live process's start time in clock ticks.
func startTicks(procRoot string, pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("invalid pid %d", pid)
	}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	p, err := parseStat(pid, b)
	if err != nil {
		return 0, err
	}
	return p.StartTicks, nil
}

// ResidentBytes returns a process's resident memory (VmRSS).
func (fsys HostFS) ResidentBytes(pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join(fsys.ProcRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "VmRSS:") {
			return parseKB(line[len("VmRSS:"):]), nil
		}
	}
	return 0, nil // a kernel thread, or a process on its way out
}

// CompilerNames are the build tools a first start may run to compile
// kernels (ninja driving nvcc and the host compiler). Their memory is left
// out of an engine's startup peak (SPEC D4); builds inside the engine's own
// processes (Triton, torch.compile workers) are still counted.
var CompilerNames = map[string]bool{
	"ninja": true, "nvcc": true, "cicc": true, "ptxas": true, "cc1plus": true, "c++": true,
	"g++": true, "gcc": true, "cc1": true, "fatbinary": true, "nvlink": true,
}

// EngineProcesses returns the processes of a launch: the members of its
// process group and every descendant of its engine process (which may have
// left the group), without the supervising shim. Compilers, and whatever
// they started, are listed apart.
func EngineProcesses(table []ProcessInfo, pgid, enginePID, shimPID int) (engine, compilers []int) {
	children := map[int][]int{}
	byPID := make(map[int]ProcessInfo, len(table))
	for _, p := range table {
		children[p.PPID] = append(children[p.PPID], p.PID)
		byPID[p.PID] = p
	}
	seen := map[int]bool{}
	add := func(pid int) {
		if pid <= 0 || pid == shimPID || seen[pid] {
			return
		}
		p, ok := byPID[pid]
		if !ok {
			return
		}
		seen[pid] = true
		if underCompiler(byPID, p, enginePID) {
			compilers = append(compilers, pid)
		} else {
			engine = append(engine, pid)
		}
	}
	if pgid > 0 {
		for _, p := range table {
			if p.PGID == pgid {
				add(p.PID)
			}
		}
	}
	queue := []int{enginePID}
	visited := map[int]bool{enginePID: true}
	add(enginePID)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if visited[c] {
				continue
			}
			visited[c] = true
			add(c)
			queue = append(queue, c)
		}
	}
	return engine, compilers
}

// underCompiler reports whether p is a compiler or runs below one, up to the
// engine process.
func underCompiler(byPID map[int]ProcessInfo, p ProcessInfo, enginePID int) bool {
	for range 64 { // bounded: a parent cycle cannot exist, but PIDs are reused
		if CompilerNames[p.Comm] {
			return true
		}
		if p.PID == enginePID || p.PPID <= 1 {
			return false
		}
		parent, ok := byPID[p.PPID]
		if !ok {
			return false
		}
		p = parent
	}
	return false
}
