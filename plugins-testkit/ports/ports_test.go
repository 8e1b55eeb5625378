// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ports

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestLease_OutsideTheEphemeralRangeAndExclusive: leased ports are below
// the kernel's range for outgoing connections, bindable, and never leased
// twice at once.
func TestLease_OutsideTheEphemeralRangeAndExclusive(t *testing.T) {
	eLo, eHi := ephemeralRange()
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		p := Lease(t)
		if seen[p] {
			t.Fatalf("port %d leased twice", p)
		}
		seen[p] = true
		if p >= eLo && p <= eHi {
			t.Fatalf("port %d is in the ephemeral range %d-%d", p, eLo, eHi)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("leased port %d cannot be bound: %v", p, err)
		}
		ln.Close()
	}
}

// TestLease_SkipsAPortLockedByAnotherProcess: a port another test process
// holds (its lock file locked) is not leased here.
func TestLease_SkipsAPortLockedByAnotherProcess(t *testing.T) {
	mu.Lock()
	want := next
	mu.Unlock()
	// Another process locks the lease file of the port this one would
	// lease next, and holds it until its stdin closes.
	dir := os.TempDir() + "/capyctl-test-ports"
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1)")
	}
	cmd := exec.Command("flock", "-x", dir+"/"+strconv.Itoa(want)+".lock", "cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	poll.Until(t, 30*time.Second, "the other process to hold the lock", func() bool {
		f, err := os.OpenFile(dir+"/"+strconv.Itoa(want)+".lock", os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return flockHeld(f)
	})
	if p := Lease(t); p == want {
		t.Fatalf("leased %d, which another process holds", p)
	}
}
