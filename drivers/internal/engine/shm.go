// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// ShmDir is where POSIX shared memory segments live.
const ShmDir = "/dev/shm"

// Files in a launch directory that track its segments.
const (
	shmBeforeFile = "shm-before.json"
	shmSeenFile   = "shm-seen.json"
)

// Shm tracks the shared-memory segments one launch makes, so that they can
// be removed once its processes are gone (SGLang leaves
// /dev/shm/sglang_loads_*.shm behind when its scheduler dies). The launch
// directory keeps what is known, so a restarted driver still cleans up.
type Shm struct {
	// Dir is the shared-memory directory (ShmDir).
	Dir string
	// LaunchDir holds the tracking files.
	LaunchDir string
	// Prefixes are the names the engine's own segments start with
	// ("sglang_"); a segment with such a name that appeared after the
	// launch started is the launch's even when no process was seen holding
	// it.
	Prefixes []string
}

// RecordBefore notes the segments that exist before the launch starts.
func (s Shm) RecordBefore() error {
	return writeNames(filepath.Join(s.LaunchDir, shmBeforeFile), s.list())
}

// Observe adds the segments that the processes hold (open or mapped) to
// what the launch is known to have made.
func (s Shm) Observe(pids []int) {
	seen := readNames(filepath.Join(s.LaunchDir, shmSeenFile))
	before := setOf(readNames(filepath.Join(s.LaunchDir, shmBeforeFile)))
	changed := false
	for _, pid := range pids {
		for _, p := range heldPaths(pid, s.Dir) {
			name := filepath.Base(p)
			if before[name] || slices.Contains(seen, name) {
				continue
			}
			seen = append(seen, name)
			changed = true
		}
	}
	if changed {
		_ = writeNames(filepath.Join(s.LaunchDir, shmSeenFile), seen)
	}
}

// Clean removes the launch's segments that no live process holds: those
// seen held by its processes, and those named with one of Prefixes that did
// not exist before it started. Call it once the launch's processes are
// proven gone. It returns the paths removed.
func (s Shm) Clean() []string {
	before := setOf(readNames(filepath.Join(s.LaunchDir, shmBeforeFile)))
	candidates := readNames(filepath.Join(s.LaunchDir, shmSeenFile))
	haveBefore := fileExists(filepath.Join(s.LaunchDir, shmBeforeFile))
	for _, name := range s.list() {
		if !haveBefore || before[name] || slices.Contains(candidates, name) {
			continue
		}
		for _, p := range s.Prefixes {
			if strings.HasPrefix(name, p) {
				candidates = append(candidates, name)
				break
			}
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	held := heldByAnyProcess(s.Dir)
	var removed []string
	for _, name := range candidates {
		p := filepath.Join(s.Dir, name)
		if held[p] || !fileExists(p) {
			continue
		}
		if os.Remove(p) == nil {
			removed = append(removed, p)
		}
	}
	sort.Strings(removed)
	return removed
}

// list returns the names in the shared-memory directory.
func (s Shm) list() []string {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// heldPaths returns the files under dir a process has open or mapped.
func heldPaths(pid int, dir string) []string {
	var out []string
	base := "/proc/" + strconv.Itoa(pid)
	if fds, err := os.ReadDir(base + "/fd"); err == nil {
		for _, fd := range fds {
			target, err := os.Readlink(base + "/fd/" + fd.Name())
			if err != nil {
				continue
			}
			target = strings.TrimSuffix(target, " (deleted)")
			if strings.HasPrefix(target, dir+"/") && !slices.Contains(out, target) {
				out = append(out, target)
			}
		}
	}
	if maps, err := os.ReadFile(base + "/maps"); err == nil {
		for _, line := range strings.Split(string(maps), "\n") {
			i := strings.Index(line, dir+"/")
			if i < 0 {
				continue
			}
			target := strings.TrimSuffix(strings.TrimSpace(line[i:]), " (deleted)")
			if !slices.Contains(out, target) {
				out = append(out, target)
			}
		}
	}
	return out
}

// heldByAnyProcess returns the files under dir any process holds.
func heldByAnyProcess(dir string) map[string]bool {
	out := map[string]bool{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		for _, p := range heldPaths(pid, dir) {
			out[p] = true
		}
	}
	return out
}

func readNames(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var names []string
	_ = json.Unmarshal(b, &names)
	return names
}

func writeNames(path string, names []string) error {
	if names == nil {
		names = []string{}
	}
	b, err := json.Marshal(names)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func setOf(names []string) map[string]bool {
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
