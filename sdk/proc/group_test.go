// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestGroup_ReadsWhatChangedAndSeesLateMembers: after its first read of
// every process, a Group reads only the processes started since and its
// members, and still finds a member started later that listens off
// loopback, even one orphaned at once (a double fork, as a wrapper script
// that starts the engine in the background and exits).
func TestGroup_ReadsWhatChangedAndSeesLateMembers(t *testing.T) {
	var read []int
	statOf = func(pid int) (statInfo, error) {
		read = append(read, pid)
		return readStat(pid)
	}
	t.Cleanup(func() { statOf = readStat })

	spec := engineSpec(t, "listen=0.0.0.0:0", map[string]string{"PATH": "/usr/bin:/bin"})
	exe := spec.Argv[0]
	spec.Env["ENGINE"] = exe
	// The wrapper waits for the file "go", then starts the engine in a
	// subshell that exits at once: the engine is orphaned.
	spec.Argv = []string{"/bin/sh", "-c", `while [ ! -e go ]; do sleep 0.01; done; ("$ENGINE" &); exec sleep 1000`}
	l := startEngine(t, spec)

	g := NewGroup(l.Pgid)
	first := g.PIDs()
	if len(first) < 2 {
		t.Fatalf("group %d: members %v, want the shim and the wrapper", l.Pgid, first)
	}
	if addrs, err := g.ListeningAddrs(); err != nil || len(addrs) != 0 {
		t.Fatalf("before the engine: ListeningAddrs = %v, %v", addrs, err)
	}
	if err := os.WriteFile(filepath.Join(l.LaunchDir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitLimit)
	for {
		outside := make(map[int]bool, len(g.known))
		for pid := range g.known {
			outside[pid] = true
		}
		read = read[:0]
		addrs, err := g.ListeningAddrs()
		for _, pid := range read {
			if outside[pid] {
				t.Fatalf("a later read read pid %d again, outside the group at the read before", pid)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) > 0 {
			if IsLoopback(addrs[0]) {
				t.Fatalf("ListeningAddrs = %v, want the engine's 0.0.0.0", addrs)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late, orphaned engine's listener never showed (members %v)", g.members)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The engine was orphaned: its parent is no member.
	var engine int
	for _, pid := range g.members {
		s, err := readStat(pid)
		if err == nil && pid != l.Pgid && s.ppid != l.Pgid {
			engine = pid
		}
	}
	if engine == 0 {
		t.Fatalf("no orphaned member among %v", g.members)
	}
	if len(read) >= len(g.members)+len(g.known) {
		t.Fatalf("the last read read %d processes of %d", len(read), len(g.members)+len(g.known))
	}
}
