// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package ports leases loopback ports to tests that launch an engine on a
// port of their choosing, as the core's port pool (core/lifecycle.PortPool)
// leases them to launches.
//
// Why not "listen on :0, close, hand the port over": the kernel takes :0
// from the ephemeral range, the same range it takes the source ports of
// outgoing connections from, and other test processes pick the same way;
// between the close and the engine's bind any of them may take the port.
// Handing the listener itself over is not possible either: an engine binds
// its own socket from a --port argument.
//
// So a lease here is race-free against the test suite itself: ports come
// from a range below the ephemeral one (no outgoing connection is ever
// given one), a port is leased to one test at a time in a process, and
// across processes (go test runs packages in parallel) by an exclusive
// lock on a file per port held until the test ends. A port some other
// program listens on is skipped.
package ports

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/capyctl/capyctl/sdk/proc"
)

// The leased range: below Linux's default ephemeral range (32768-60999)
// and above the engine ports a role uses by default (8100-8199).
const (
	lo = 20000
	hi = 29999
)

var (
	mu     sync.Mutex
	leased = map[int]bool{}
	next   = lo + rand.IntN(hi-lo+1)
)

// Lease returns a loopback port nothing listens on, reserved for t until it
// ends: no other test of this or another test process leases it meanwhile.
func Lease(t testing.TB) int {
	t.Helper()
	port, release, err := lease()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return port
}

// LeaseRange returns the first of n consecutive loopback ports nothing
// listens on, each reserved for t until it ends as Lease reserves one (an
// engine that binds ports next to the one it is given needs them all).
func LeaseRange(t testing.TB, n int) int {
	t.Helper()
	for try := 0; try < 1000; try++ {
		first, release, err := lease()
		if err != nil {
			t.Fatal(err)
		}
		releases := []func(){release}
		ok := true
		for i := 1; i < n && ok; i++ {
			r, err := leasePort(first + i)
			if err != nil {
				ok = false
				break
			}
			releases = append(releases, r)
		}
		if ok {
			t.Cleanup(func() {
				for _, r := range releases {
					r()
				}
			})
			return first
		}
		for _, r := range releases {
			r()
		}
	}
	t.Fatalf("no %d consecutive free loopback ports in %d-%d", n, lo, hi)
	return 0
}

func lease() (int, func(), error) {
	dir := filepath.Join(os.TempDir(), "capyctl-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, nil, fmt.Errorf("port lease directory: %w", err)
	}
	eLo, eHi := ephemeralRange()
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i <= hi-lo; i++ {
		port := next
		if next++; next > hi {
			next = lo
		}
		if leased[port] || (port >= eLo && port <= eHi) {
			continue
		}
		if release, ok := lockPort(dir, port); ok {
			return port, release, nil
		}
	}
	return 0, nil, fmt.Errorf("no free loopback port in %d-%d", lo, hi)
}

// leasePort leases one given port, or fails.
func leasePort(port int) (func(), error) {
	dir := filepath.Join(os.TempDir(), "capyctl-test-ports")
	eLo, eHi := ephemeralRange()
	mu.Lock()
	defer mu.Unlock()
	if port > hi || leased[port] || (port >= eLo && port <= eHi) {
		return nil, fmt.Errorf("port %d is taken", port)
	}
	release, ok := lockPort(dir, port)
	if !ok {
		return nil, fmt.Errorf("port %d is taken", port)
	}
	return release, nil
}

// lockPort takes port's lock file and checks nothing listens on it; mu is
// held.
func lockPort(dir string, port int) (func(), bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)+".lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close() // another test process holds it
		return nil, false
	}
	if !proc.PortFree(port) {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		return nil, false
	}
	leased[port] = true
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		mu.Lock()
		delete(leased, port)
		mu.Unlock()
	}, true
}

// ephemeralRange is the kernel's range for outgoing connections' ports.
func ephemeralRange() (int, int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768, 60999
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768, 60999
	}
	a, err1 := strconv.Atoi(f[0])
	z, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 32768, 60999
	}
	return a, z
}
