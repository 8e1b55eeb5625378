// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// coreLimit returns the "Max core file size" line of a process's limits.
func coreLimit(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max core file size") {
			return strings.Fields(strings.TrimPrefix(l, "Max core file size"))
		}
	}
	t.Fatalf("no core limit in %s", b)
	return nil
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
