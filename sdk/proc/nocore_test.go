// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// coreLimit returns the soft and hard "Max core file size" of a process.
func coreLimit(t *testing.T, pid int) []string {
	t.Helper()
	soft, hard, err := CoreFileLimit(pid)
	if err != nil {
		t.Fatal(err)
	}
	return []string{soft, hard}
}

func TestStart_NoCoreDumps(t *testing.T) {
	cases := []struct {
		name   string
		noCore bool
	}{
		{"retention zero", true},
		{"standard", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := engineSpec(t, "tick", nil)
			spec.NoCoreDumps = c.noCore
			l := startEngine(t, spec)
			f := coreLimit(t, l.Engine.PID)
			if c.noCore {
				if f[0] != "0" || f[1] != "0" {
					t.Fatalf("core limit %v, want 0 0", f)
				}
				return
			}
			// Without it the engine inherits the limit of whoever started it.
			if own := coreLimit(t, os.Getpid()); f[0] != own[0] || f[1] != own[1] {
				t.Fatalf("core limit %v, want the inherited %v", f, own)
			}
		})
	}
}

// noCore is the "nocore" helper: it calls DisableCoreDumps and prints its
// dumpable flag, then its core-file limits.
func noCore() int {
	if err := DisableCoreDumps(); err != nil {
		fmt.Println("error", err)
		return 1
	}
	d, err := Dumpable()
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	b, _ := os.ReadFile("/proc/self/limits")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max core file size") {
			fmt.Println("dumpable", d, "limit", strings.Join(strings.Fields(strings.TrimPrefix(l, "Max core file size"))[:2], " "))
		}
	}
	return 0
}

func TestDisableCoreDumps(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=nocore")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v %s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "dumpable false limit 0 0"; got != want {
		t.Fatalf("after DisableCoreDumps: %q, want %q", got, want)
	}
}
