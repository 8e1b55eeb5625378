// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"strings"
	"syscall"
	"testing"
)

// companionSpec is a launch whose companion is the fake engine too, with
// its own actions.
func companionSpec(t *testing.T, engineActions, companionActions string) LaunchSpec {
	spec := engineSpec(t, engineActions, map[string]string{"ENGINE_PRINT": "engine says hi"})
	spec.Companion = &CompanionSpec{
		Role: "lmcache",
		Argv: []string{testExe(t)},
		Env: map[string]string{helperEnv: "engine", "ENGINE_ACTIONS": companionActions, "ENGINE_PRINT": "companion says hi",
			"GORACE": "atexit_sleep_ms=0"},
	}
	return spec
}

func TestStart_Companion(t *testing.T) {
	cases := []struct {
		name string
		// kill is the process the test kills: "engine" or "companion".
		kill string
	}{
		{name: "the engine ends: its companion is stopped", kill: "engine"},
		{name: "the companion ends: the engine is stopped", kill: "companion"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := startEngine(t, companionSpec(t, "print", "print"))
			if l.Companion.PID == 0 || !Alive(l.Companion) {
				t.Fatalf("companion identity %+v, alive %v", l.Companion, Alive(l.Companion))
			}
			if !containsInt(GroupPIDs(l.Pgid), l.Companion.PID) {
				t.Fatalf("the companion %d is not in the launch's group %v", l.Companion.PID, GroupPIDs(l.Pgid))
			}
			waitTail(t, l.LaunchDir, "[lmcache] companion says hi")
			if text := waitTail(t, l.LaunchDir, "engine says hi"); strings.Contains(text, "[lmcache] engine says hi") {
				t.Fatalf("the engine's output is labelled as the companion's:\n%s", text)
			}
			if rl, err := ReadLaunched(l.LaunchDir); err != nil || rl.Companion != l.Companion {
				t.Fatalf("launched.json companion %+v (%v), want %+v", rl.Companion, err, l.Companion)
			}
			victim, other := l.Engine, l.Companion
			if c.kill == "companion" {
				victim, other = l.Companion, l.Engine
			}
			if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if !poll(waitLimit, func() bool { return !Alive(other) }) {
				t.Fatalf("%s killed, the other process %d still runs", c.kill, other.PID)
			}
			st, err := WaitExitStatus(l.LaunchDir, waitLimit)
			if err != nil || !st.Exited {
				t.Fatalf("exit status %+v %v", st, err)
			}
			res, err := Stop(*l, 0)
			if err != nil || !res.Gone {
				t.Fatalf("Stop: %+v %v", res, err)
			}
		})
	}
}

func TestStart_CompanionStoppedWithTheGroup(t *testing.T) {
	l := startEngine(t, companionSpec(t, "", "ignore-term"))
	waitTail(t, l.LaunchDir, "[lmcache] ready")
	// A companion that ignores SIGTERM is still proven gone by Stop.
	res, err := Stop(*l, 0)
	if err != nil || !res.Gone || Alive(l.Companion) {
		t.Fatalf("Stop: %+v %v; companion alive %v", res, err, Alive(l.Companion))
	}
}
