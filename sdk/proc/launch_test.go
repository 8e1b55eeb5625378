// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitLimit bounds every wait on a real process in these tests. It is a
// deadline for a condition, never a duration the tests assert on.
const waitLimit = 10 * time.Second

// eventually polls cond until it holds, failing the test after waitLimit.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(waitLimit, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// testExe is the test binary, which plays the shim and the fake engine.
func testExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// engineSpec is a launch of the fake engine with the given actions.
func engineSpec(t *testing.T, actions string, env map[string]string) LaunchSpec {
	t.Helper()
	// GORACE: a race-enabled binary otherwise sleeps a second at exit.
	full := map[string]string{helperEnv: "engine", "ENGINE_ACTIONS": actions, "GORACE": "atexit_sleep_ms=0"}
	for k, v := range env {
		full[k] = v
	}
	return LaunchSpec{
		Argv:      []string{testExe(t)},
		Env:       full,
		LaunchDir: filepath.Join(t.TempDir(), "launch"),
		LogMode:   LogModeFile,
	}
}

// startEngine starts spec and stops it when the test ends.
func startEngine(t *testing.T, spec LaunchSpec) *Launched {
	t.Helper()
	l, err := Start(spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if _, err := Stop(*l, 0); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
		_ = Release(l.LaunchDir)
	})
	return l
}

// waitTail waits until the tail of dir contains want and returns it.
func waitTail(t *testing.T, dir, want string) string {
	t.Helper()
	var text string
	var err error
	ok := poll(waitLimit, func() bool {
		text, _, err = Tail(dir, 1<<20)
		return err == nil && strings.Contains(text, want)
	})
	if !ok {
		t.Fatalf("tail never contained %q (err %v); tail:\n%s", want, err, text)
	}
	return text
}

func TestStart_StatusAndTail(t *testing.T) {
	spec := engineSpec(t, "print,env,pwd", map[string]string{
		"ENGINE_PRINT":     "hello from the engine",
		"ENGINE_PRINT_ERR": "and from its stderr",
		"PATH":             "/usr/bin:/bin",
	})
	l := startEngine(t, spec)

	if l.Pgid != l.Shim.PID {
		t.Errorf("pgid %d, want the shim's pid %d", l.Pgid, l.Shim.PID)
	}
	if !Alive(l.Shim) || !Alive(l.Engine) {
		t.Fatalf("shim alive %v, engine alive %v", Alive(l.Shim), Alive(l.Engine))
	}
	shimStat, err := readStat(l.Shim.PID)
	if err != nil || shimStat.pgrp != l.Shim.PID {
		t.Errorf("shim does not lead its process group: %+v %v", shimStat, err)
	}
	// In the caller's session: a new session is a scheduling group of its
	// own under autogroup, slow to fork the engine on a busy machine.
	if sid := sessionOf(t, os.Getpid()); shimStat.session != sid || sessionOf(t, l.Engine.PID) != sid {
		t.Errorf("shim session %d, want the caller's %d", shimStat.session, sid)
	}
	engStat, err := readStat(l.Engine.PID)
	if err != nil || engStat.pgrp != l.Pgid || engStat.ppid != l.Shim.PID {
		t.Errorf("engine stat %+v (%v), want pgrp %d and parent %d", engStat, err, l.Pgid, l.Shim.PID)
	}
	group := GroupPIDs(l.Pgid)
	if !containsInt(group, l.Shim.PID) || !containsInt(group, l.Engine.PID) {
		t.Errorf("GroupPIDs(%d) = %v, want the shim and the engine", l.Pgid, group)
	}

	text := waitTail(t, l.LaunchDir, "ready")
	for _, want := range []string{"hello from the engine", "and from its stderr", "pwd " + l.LaunchDir} {
		if !strings.Contains(text, want) {
			t.Errorf("tail lacks %q:\n%s", want, text)
		}
	}
	// The environment is exactly the spec's: nothing inherited.
	wantEnv := "env ENGINE_ACTIONS=print,env,pwd;ENGINE_PRINT=hello from the engine;ENGINE_PRINT_ERR=and from its stderr;GORACE=atexit_sleep_ms=0;PATH=/usr/bin:/bin;PROC_TEST_HELPER=engine\n"
	if !strings.Contains(text, wantEnv) {
		t.Errorf("engine environment is not exactly the spec's; tail:\n%s", text)
	}

	st, err := ReadStatus(l.LaunchDir)
	if err != nil {
		t.Fatalf("ReadStatus: %v", err)
	}
	if !st.Running || st.Exited || st.EnginePID != l.Engine.PID {
		t.Errorf("status %+v, want running engine %d", st, l.Engine.PID)
	}

	// The engine starts with a clean signal table: the shim's handling of
	// SIGINT/SIGHUP/SIGTERM is not inherited as "ignored".
	if ign := sigIgnored(t, l.Engine.PID); ign&(1<<(syscall.SIGINT-1)|1<<(syscall.SIGHUP-1)|1<<(syscall.SIGTERM-1)|1<<(syscall.SIGPIPE-1)) != 0 {
		t.Errorf("engine ignores signals it should not: SigIgn %x", ign)
	}
	if name := ProcessName(l.Engine.PID); name == "" {
		t.Error("ProcessName of the engine is empty")
	}
	assertMode(t, l.LaunchDir, 0o700)
	assertMode(t, filepath.Join(l.LaunchDir, LogFileName), 0o600)

	res, err := Stop(*l, waitLimit)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !res.Gone || res.Forced || res.Signal != "SIGTERM" || res.ExitCode != 128+int(syscall.SIGTERM) {
		t.Errorf("Stop = %+v, want gone by SIGTERM, not forced", res)
	}
	if len(GroupPIDs(l.Pgid)) != 0 || Alive(l.Shim) || Alive(l.Engine) {
		t.Error("processes left after Stop")
	}
	// With the shim gone, the log files still answer.
	text, _, err = Tail(l.LaunchDir, 1<<20)
	if err != nil || !strings.Contains(text, "hello from the engine") {
		t.Errorf("Tail after stop = %q, %v", text, err)
	}
	st, err = ReadStatus(l.LaunchDir)
	if err != nil || !st.Exited || st.Signal != "SIGTERM" {
		t.Errorf("ReadStatus after stop = %+v, %v", st, err)
	}
}

func TestStart_SecretsNeverWritten(t *testing.T) {
	const (
		engineKey = "Xk9-engine-key-7f3a2b"
		adminKey  = "adm1n-K3y-zzz"
	)
	printed := "engine key " + engineKey + " Authorization: Bearer tok3nVALUE99 url https://bob:pw123@example.com/x?token=qq11"
	printedErr := "--api-key " + adminKey + " HF_TOKEN=hf_abcdefghijklmnopqrstuvwx INFO 2025-01-01 12:00:00 loaded /models/llama-3"
	cases := []struct {
		name string
		mode string
	}{
		{name: "file", mode: LogModeFile},
		{name: "memory", mode: LogModeMemory},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := engineSpec(t, "print,partial,exit=0", map[string]string{
				"ENGINE_PRINT":     printed,
				"ENGINE_PRINT_ERR": printedErr,
				"VLLM_API_KEY":     engineKey,
			})
			spec.LogMode = c.mode
			spec.Secrets = []string{engineKey, adminKey}
			l := startEngine(t, spec)

			// The spec travels over a pipe: the shim's command line and
			// environment do not hold it.
			for _, f := range []string{"cmdline", "environ"} {
				if b, err := os.ReadFile("/proc/" + strconv.Itoa(l.Shim.PID) + "/" + f); err == nil && strings.Contains(string(b), engineKey) {
					t.Errorf("shim %s holds the engine key", f)
				}
			}
			eventually(t, "the exit record", func() bool {
				st, err := ReadStatus(l.LaunchDir)
				return err == nil && st.Exited
			})
			text := waitTail(t, l.LaunchDir, "partial line")
			for _, secret := range []string{engineKey, adminKey, "tok3nVALUE99", "pw123", "qq11", "hf_abcdefghijklmnopqrstuvwx"} {
				if strings.Contains(text, secret) {
					t.Errorf("tail holds %q:\n%s", secret, text)
				}
			}
			for _, kept := range []string{"INFO 2025-01-01 12:00:00 loaded /models/llama-3", "https://<redacted>@example.com/x?token=<redacted>", "--api-key <redacted>"} {
				if !strings.Contains(text, kept) {
					t.Errorf("tail lacks %q:\n%s", kept, text)
				}
			}
			// No file in the launch directory holds a secret; memory mode
			// writes no log at all.
			entries, err := os.ReadDir(l.LaunchDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if c.mode == LogModeMemory && strings.HasPrefix(e.Name(), LogFileName) {
					t.Errorf("memory mode wrote %s", e.Name())
				}
				if e.Type().IsRegular() {
					b, _ := os.ReadFile(filepath.Join(l.LaunchDir, e.Name()))
					if strings.Contains(string(b), engineKey) || strings.Contains(string(b), adminKey) {
						t.Errorf("%s holds a secret", e.Name())
					}
				}
			}
			if c.mode == LogModeFile {
				b, err := os.ReadFile(filepath.Join(l.LaunchDir, LogFileName))
				if err != nil || !strings.Contains(string(b), "engine key <redacted>") {
					t.Errorf("engine.log = %q, %v", b, err)
				}
			}
		})
	}
}

func TestStart_MemoryModeLingers(t *testing.T) {
	spec := engineSpec(t, "print,exit=3", map[string]string{"ENGINE_PRINT": "the last words"})
	spec.LogMode = LogModeMemory
	l := startEngine(t, spec)

	eventually(t, "the exit", func() bool {
		st, err := ReadStatus(l.LaunchDir)
		return err == nil && st.Exited
	})
	// The engine is gone, the shim still serves its ring.
	if !Alive(l.Shim) {
		t.Fatal("memory-mode shim did not linger")
	}
	if lines := LastLines(l.LaunchDir, 5); len(lines) != 1 || lines[0] != "the last words" {
		t.Errorf("LastLines = %q", lines)
	}
	if err := Release(l.LaunchDir); err != nil {
		t.Fatalf("Release: %v", err)
	}
	eventually(t, "the shim to leave", func() bool { return !Alive(l.Shim) })
	st, err := ReadStatus(l.LaunchDir)
	if err != nil || !st.Exited || st.ExitCode != 3 || st.EnginePID != l.Engine.PID {
		t.Errorf("ReadStatus = %+v, %v; want exited 3", st, err)
	}
	if _, _, err := Tail(l.LaunchDir, 100); !errors.Is(err, ErrNoLogs) {
		t.Errorf("Tail without shim in memory mode: %v, want ErrNoLogs", err)
	}
	if _, err := os.Stat(filepath.Join(l.LaunchDir, LogFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("memory mode left a log file: %v", err)
	}
}

func TestStart_ExitStatus(t *testing.T) {
	cases := []struct {
		name       string
		actions    string
		kill       syscall.Signal
		wantCode   int
		wantSignal string
	}{
		{name: "exit 3", actions: "exit=3", wantCode: 3},
		{name: "exit 0", actions: "exit=0", wantCode: 0},
		{name: "killed", actions: "", kill: syscall.SIGKILL, wantCode: 137, wantSignal: "SIGKILL"},
		{name: "terminated", actions: "", kill: syscall.SIGTERM, wantCode: 143, wantSignal: "SIGTERM"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := startEngine(t, engineSpec(t, c.actions, nil))
			if c.kill != 0 {
				waitTail(t, l.LaunchDir, "ready")
				if err := syscall.Kill(l.Engine.PID, c.kill); err != nil {
					t.Fatal(err)
				}
			}
			// File mode: the shim records the exit and leaves promptly.
			eventually(t, "the shim to leave", func() bool { return !Alive(l.Shim) })
			st, err := ReadStatus(l.LaunchDir)
			if err != nil {
				t.Fatalf("ReadStatus: %v", err)
			}
			if !st.Exited || st.Running || st.ExitCode != c.wantCode || st.Signal != c.wantSignal {
				t.Errorf("status %+v, want exit %d signal %q", st, c.wantCode, c.wantSignal)
			}
			var rec map[string]any
			b, err := os.ReadFile(filepath.Join(l.LaunchDir, ExitFileName))
			if err != nil || json.Unmarshal(b, &rec) != nil {
				t.Fatalf("exit.json: %q %v", b, err)
			}
			if rec["code"] != float64(c.wantCode) || rec["at"] == nil {
				t.Errorf("exit.json = %s", b)
			}
			assertMode(t, filepath.Join(l.LaunchDir, ExitFileName), 0o600)
		})
	}
}

func TestStart_PartialLineKeptAtExit(t *testing.T) {
	l := startEngine(t, engineSpec(t, "partial,exit=0", nil))
	eventually(t, "the shim to leave", func() bool { return !Alive(l.Shim) })
	b, err := os.ReadFile(filepath.Join(l.LaunchDir, LogFileName))
	if err != nil || string(b) != "partial line" {
		t.Errorf("engine.log = %q, %v", b, err)
	}
}

func TestStart_LogRotation(t *testing.T) {
	// TestMain sets the rotation size to 64 KiB; write 4 files' worth.
	l := startEngine(t, engineSpec(t, "flood=260000", nil))
	waitTail(t, l.LaunchDir, "ready")
	if _, err := Stop(*l, waitLimit); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < LogFiles; i++ {
		p := logPath(l.LaunchDir, i)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if st.Size() > testRotateBytes || st.Size() == 0 {
			t.Errorf("%s has %d bytes, want 1..%d", p, st.Size(), testRotateBytes)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %o", p, st.Mode().Perm())
		}
		b, _ := os.ReadFile(p)
		if len(b) > 0 && b[len(b)-1] != '\n' {
			t.Errorf("%s does not end at a line boundary", p)
		}
	}
	if _, err := os.Stat(logPath(l.LaunchDir, LogFiles)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("more than %d log files: %v", LogFiles, err)
	}
	// The shim is gone: Tail reads the files, oldest first, lines whole.
	text, truncated, err := Tail(l.LaunchDir, 1<<20)
	if err != nil || !truncated {
		t.Fatalf("Tail = truncated %v, %v", truncated, err)
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if lines[len(lines)-1] != "ready" {
		t.Errorf("last line %q, want ready", lines[len(lines)-1])
	}
	line := regexp.MustCompile(`^(\d{8}) x{90}$`)
	prev := -1
	for _, s := range lines[:len(lines)-1] {
		m := line.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("broken line %q", s)
		}
		n, _ := strconv.Atoi(m[1])
		if prev >= 0 && n != prev+1 {
			t.Fatalf("line %d follows %d", n, prev)
		}
		prev = n
	}
	// A small tail starts at a line boundary.
	text, truncated, err = Tail(l.LaunchDir, 250)
	if err != nil || !truncated || len(text) > 250 || !line.MatchString(strings.Split(text, "\n")[0]) {
		t.Errorf("Tail(250) = %q, %v, %v", text, truncated, err)
	}
}

func TestStart_SurvivesStarterDeath(t *testing.T) {
	spec := engineSpec(t, "tick", nil)
	b, _ := json.Marshal(spec)
	starter := exec.Command(testExe(t))
	starter.Env = []string{helperEnv + "=starter", "STARTER_SPEC=" + string(b)}
	out, err := starter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := starter.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = starter.Process.Kill()
		t.Fatalf("starter said %q: %v", line, err)
	}
	var l Launched
	if err := json.Unmarshal([]byte(line), &l); err != nil {
		_ = starter.Process.Kill()
		t.Fatalf("starter said %q", line)
	}
	t.Cleanup(func() { _, _ = Stop(l, 0) })

	// kill -9 the process that called Start.
	if err := starter.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = starter.Wait()

	if !Alive(l.Engine) || !Alive(l.Shim) {
		t.Fatalf("engine alive %v, shim alive %v after the starter died", Alive(l.Engine), Alive(l.Shim))
	}
	// The engine's output is still captured: ticks newer than those
	// written before the starter died arrive.
	last := lastTick(t, l.LaunchDir)
	eventually(t, "newer ticks", func() bool { return lastTick(t, l.LaunchDir) > last+3 })

	res, err := Stop(l, waitLimit)
	if err != nil || !res.Gone {
		t.Fatalf("Stop = %+v, %v", res, err)
	}
}

// lastTick returns the highest "tick N" in the tail, -1 for none.
func lastTick(t *testing.T, dir string) int {
	text, _, err := Tail(dir, 4096)
	if err != nil {
		return -1
	}
	n := -1
	for _, m := range regexp.MustCompile(`tick (\d+)\n`).FindAllStringSubmatch(text, -1) {
		v, _ := strconv.Atoi(m[1])
		n = max(n, v)
	}
	return n
}

func TestStart_ProgramErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badInterp := filepath.Join(dir, "bad-interpreter")
	if err := os.WriteFile(badInterp, []byte("#!/nonexistent/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		argv string
		path string
		want string
	}{
		{name: "missing absolute", argv: "/nonexistent/bin/engine-xyz", want: "/nonexistent/bin/engine-xyz"},
		{name: "missing in PATH", argv: "engine-xyz-not-there", path: "/usr/bin:/bin", want: "engine-xyz-not-there"},
		{name: "not in the engine's PATH", argv: "sh", path: dir, want: "sh"},
		{name: "not executable", argv: plain, want: plain},
		{name: "directory", argv: dir, want: dir},
		{name: "exec fails in the shim", argv: badInterp, want: badInterp},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := LaunchSpec{
				Argv:      []string{c.argv},
				Env:       map[string]string{"PATH": c.path},
				LaunchDir: filepath.Join(t.TempDir(), "launch"),
			}
			l, err := Start(spec)
			if err == nil {
				_, _ = Stop(*l, 0)
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
		})
	}
}

func TestStart_Shell(t *testing.T) {
	spec := LaunchSpec{
		Argv:      []string{"sh", "-c", `echo "shell engine $$"; exec sleep 1000`},
		Env:       map[string]string{"PATH": "/usr/bin:/bin"},
		LaunchDir: filepath.Join(t.TempDir(), "launch"),
	}
	l := startEngine(t, spec)
	waitTail(t, l.LaunchDir, "shell engine "+strconv.Itoa(l.Engine.PID))
	eventually(t, "the exec", func() bool { return ProcessName(l.Engine.PID) == "sleep" })
	res, err := Stop(*l, waitLimit)
	if err != nil || !res.Gone || res.Signal != "SIGTERM" {
		t.Errorf("Stop = %+v, %v", res, err)
	}
}

func TestStart_RefusesBusyLaunchDir(t *testing.T) {
	spec := engineSpec(t, "", nil)
	startEngine(t, spec)
	if l, err := Start(spec); err == nil {
		_, _ = Stop(*l, 0)
		t.Fatal("second Start in a busy launch directory succeeded")
	}
}

func TestStart_LongLaunchDir(t *testing.T) {
	spec := engineSpec(t, "print", map[string]string{"ENGINE_PRINT": "long dir works"})
	spec.LaunchDir = filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	l := startEngine(t, spec)
	waitTail(t, l.LaunchDir, "long dir works")
	if st, err := ReadStatus(l.LaunchDir); err != nil || !st.Running {
		t.Errorf("ReadStatus = %+v, %v", st, err)
	}
}

// containsInt reports whether v is in s.
func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// sigIgnored returns the SigIgn mask of pid.
func sigIgnored(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no SigIgn line")
	return 0
}

// assertMode checks the permission bits of p.
func assertMode(t *testing.T, p string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Errorf("stat %s: %v", p, err)
		return
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s mode %o, want %o", p, st.Mode().Perm(), want)
	}
}

// sessionOf is the session of pid.
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	st, err := readStat(pid)
	if err != nil {
		t.Fatalf("read stat of %d: %v", pid, err)
	}
	return st.session
}
