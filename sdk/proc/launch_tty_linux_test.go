// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// TestStart_EngineHasNoTerminal starts an engine from a process whose
// session has a terminal (a pseudo-terminal made here), as a role started
// from a shell has: the shim shares that session, yet neither it nor the
// engine may keep the terminal.
func TestStart_EngineHasNoTerminal(t *testing.T) {
	master, slave := openPTY(t)
	defer master.Close()
	defer slave.Close()
	spec := engineSpec(t, "tick", nil)
	b, _ := json.Marshal(spec)
	starter := exec.Command(testExe(t))
	starter.Env = []string{helperEnv + "=starter", "STARTER_SPEC=" + string(b)}
	starter.Stdin = slave
	starter.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	out, err := starter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := starter.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = starter.Process.Kill()
		_ = starter.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	var l Launched
	if err != nil || json.Unmarshal([]byte(line), &l) != nil {
		t.Fatalf("starter said %q: %v", line, err)
	}
	t.Cleanup(func() { _, _ = Stop(l, 0) })

	if ttyOf(t, starter.Process.Pid) == 0 {
		t.Fatal("the starter has no terminal: the test proves nothing")
	}
	if sessionOf(t, l.Shim.PID) != sessionOf(t, starter.Process.Pid) {
		t.Fatal("the shim is not in its starter's session")
	}
	if tty := ttyOf(t, l.Shim.PID); tty != 0 {
		t.Errorf("the shim keeps the terminal (tty_nr %d)", tty)
	}
	if tty := ttyOf(t, l.Engine.PID); tty != 0 {
		t.Errorf("the engine has the session's terminal (tty_nr %d)", tty)
	}
}

// openPTY makes a pseudo-terminal pair; the test is skipped where the
// machine has none.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals on this machine: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Skipf("unlock the pseudo-terminal: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Skipf("name the pseudo-terminal: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("open the pseudo-terminal: %v", err)
	}
	return m, s
}

// ttyOf is the controlling terminal of pid (field 7 of its stat; 0: none).
func ttyOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("read stat of %d: %v", pid, err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	tty, err := strconv.Atoi(f[4])
	if err != nil {
		t.Fatalf("stat of %d: %q", pid, s)
	}
	return tty
}
