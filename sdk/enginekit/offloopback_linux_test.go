// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package enginekit

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/capyctl/capyctl/sdk/proc"
)

// TestHelperListener is not a test: run by listenerGroup as a process
// group of its own, it listens on $CAPYCTL_TEST_LISTEN_ON and says so on stdout.
func TestHelperListener(t *testing.T) {
	addr := os.Getenv("CAPYCTL_TEST_LISTEN_ON")
	if addr == "" {
		t.Skip("helper process only")
	}
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		os.Exit(3)
	}
	defer l.Close()
	os.Stdout.WriteString("listening\n")
	_, _ = l.Accept() // nobody connects: until killed
}

// listenerGroup starts a process group whose one member listens on addr.
func listenerGroup(t *testing.T, addr string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperListener$")
	cmd.Env = append(os.Environ(), "CAPYCTL_TEST_LISTEN_ON="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("listener on %s did not start: %q, %v", addr, line, err)
	}
	return cmd.Process.Pid
}

// TestInstance_OffLoopbackFollowsARelaunch: the listener check reads the
// group of the launch the Instance holds now; after a relaunch on the same
// Instance, an engine of the new group listening off loopback is found.
func TestInstance_OffLoopbackFollowsARelaunch(t *testing.T) {
	first := listenerGroup(t, "127.0.0.1:0")
	in := &Instance{Launched: proc.Launched{Pgid: first}}
	if bad := in.offLoopbackAddr(); bad != "" {
		t.Fatalf("first launch listens on loopback only, check says %q", bad)
	}
	in.Launched = proc.Launched{Pgid: listenerGroup(t, "0.0.0.0:0")}
	if bad := in.offLoopbackAddr(); bad == "" {
		t.Fatal("the relaunch listens on 0.0.0.0 and the check found nothing: it still reads the first launch's group")
	}
}
