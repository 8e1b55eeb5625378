// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"bufio"
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStop_ForcedWithGrandchild(t *testing.T) {
	// The engine ignores SIGTERM, and so does its child (the disposition is
	// inherited): only SIGKILL ends them.
	l := startEngine(t, engineSpec(t, "ignore-term,child", nil))
	text := waitTail(t, l.LaunchDir, "ready")
	m := regexp.MustCompile(`child (\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no child in tail:\n%s", text)
	}
	childPID, _ := strconv.Atoi(m[1])
	ticks, err := ReadStartTicks(childPID)
	if err != nil {
		t.Fatal(err)
	}
	child := Identity{PID: childPID, StartTicks: ticks}
	if !containsInt(GroupPIDs(l.Pgid), childPID) {
		t.Fatalf("grandchild %d not in group %v", childPID, GroupPIDs(l.Pgid))
	}
	if !containsInt(Descendants(l.Shim.PID), childPID) {
		t.Errorf("grandchild %d not among the shim's descendants %v", childPID, Descendants(l.Shim.PID))
	}

	res, err := Stop(*l, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("Stop: %v (%+v)", err, res)
	}
	if !res.Gone || !res.Forced {
		t.Errorf("Stop = %+v, want gone and forced", res)
	}
	if res.Signal != "SIGKILL" || res.ExitCode != 137 {
		t.Errorf("Stop recorded exit %d signal %q, want 137 SIGKILL", res.ExitCode, res.Signal)
	}
	if Alive(child) || Alive(l.Engine) || Alive(l.Shim) || len(GroupPIDs(l.Pgid)) != 0 {
		t.Error("a process survived the forced stop")
	}
}

func TestStop_EngineExitedGrandchildLeft(t *testing.T) {
	// The engine leaves a grandchild behind when it exits: the shim stays,
	// anchoring the group, and Stop still ends the grandchild.
	spec := engineSpec(t, "ignore-term,child,exit=5", nil)
	l := startEngine(t, spec)
	eventually(t, "the engine's exit", func() bool {
		st, err := ReadStatus(l.LaunchDir)
		return err == nil && st.Exited
	})
	if !Alive(l.Shim) || len(GroupPIDs(l.Pgid)) < 2 {
		t.Fatalf("shim alive %v, group %v: the shim must anchor a non-empty group", Alive(l.Shim), GroupPIDs(l.Pgid))
	}
	res, err := Stop(*l, 50*time.Millisecond)
	if err != nil || !res.Gone || !res.Forced || res.ExitCode != 5 {
		t.Errorf("Stop = %+v, %v; want gone, forced, exit 5", res, err)
	}
}

func TestStop_RefusesMismatchedIdentity(t *testing.T) {
	l := startEngine(t, engineSpec(t, "", nil))
	waitTail(t, l.LaunchDir, "ready")

	// An unrelated group whose leader has exited: sh starts sleep in the
	// background and leaves.
	sh := exec.Command("/bin/sh", "-c", "sleep 1000 & echo $!")
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	sleepPID, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("sh said %q", line)
	}
	orphanGroup := sh.Process.Pid
	_ = sh.Wait()
	t.Cleanup(func() { _ = syscall.Kill(-orphanGroup, syscall.SIGKILL) })
	sleepTicks, _ := ReadStartTicks(sleepPID)
	sleepID := Identity{PID: sleepPID, StartTicks: sleepTicks}

	wrongShim := *l
	wrongShim.Shim.StartTicks++
	cases := []struct {
		name   string
		launch Launched
		victim Identity
	}{
		{name: "shim pid reused", launch: wrongShim, victim: l.Engine},
		{name: "no recorded process alive", launch: Launched{
			Pgid:   orphanGroup,
			Shim:   Identity{PID: orphanGroup, StartTicks: 1},
			Engine: Identity{PID: sleepPID, StartTicks: sleepTicks + 1},
		}, victim: sleepID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Stop(c.launch, 0)
			if !errors.Is(err, ErrIdentityMismatch) {
				t.Fatalf("Stop = %+v, %v; want ErrIdentityMismatch", res, err)
			}
			if res.Gone {
				t.Error("Stop claims the launch is gone")
			}
			if !Alive(c.victim) {
				t.Error("Stop signalled a process it could not prove was the launch's")
			}
			if c.launch.Pgid == orphanGroup {
				if st, detail := Inspect(c.launch); st != LaunchUncertain {
					t.Errorf("Inspect = %s (%s), want uncertain", st, detail)
				}
			}
		})
	}
}

func TestStop_AlreadyGone(t *testing.T) {
	l := startEngine(t, engineSpec(t, "exit=7", nil))
	eventually(t, "the shim to leave", func() bool { return !Alive(l.Shim) })
	res, err := Stop(*l, time.Second)
	if err != nil || !res.Gone || res.Forced || res.ExitCode != 7 {
		t.Errorf("Stop = %+v, %v; want gone with exit 7", res, err)
	}
}

func TestStop_RefusesOwnGroup(t *testing.T) {
	cases := []struct {
		name string
		pgid int
	}{
		{name: "zero", pgid: 0},
		{name: "init", pgid: 1},
		{name: "own group", pgid: syscall.Getpgrp()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Stop(Launched{Pgid: c.pgid}, 0); err == nil {
				t.Error("Stop accepted the group")
			}
		})
	}
}

func TestInspect(t *testing.T) {
	running := startEngine(t, engineSpec(t, "", nil))
	waitTail(t, running.LaunchDir, "ready")
	left := startEngine(t, engineSpec(t, "ignore-term,child,exit=0", nil))
	eventually(t, "the engine's exit", func() bool {
		st, err := ReadStatus(left.LaunchDir)
		return err == nil && st.Exited
	})
	done := startEngine(t, engineSpec(t, "exit=0", nil))
	eventually(t, "the shim to leave", func() bool { return !Alive(done.Shim) })
	cases := []struct {
		name string
		l    Launched
		want LaunchState
	}{
		{name: "running", l: *running, want: LaunchRunning},
		{name: "engine exited, grandchild left", l: *left, want: LaunchExited},
		{name: "all gone", l: *done, want: LaunchGone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, detail := Inspect(c.l); got != c.want {
				t.Errorf("Inspect = %s (%s), want %s", got, detail, c.want)
			}
		})
	}
}
