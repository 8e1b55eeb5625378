// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// An engine launched with NetNamespace listens in a namespace of its own:
// from the host's namespace nothing listens on its port, and DialNetns
// reaches it.
func TestStart_NetNamespace(t *testing.T) {
	if !NetnsSupported() {
		t.Skip("a network namespace of its own needs root and a kernel that lets it unshare one")
	}
	port := freePort(t)
	spec := engineSpec(t, fmt.Sprintf("listen=127.0.0.1:%d", port), nil)
	spec.NetNamespace = true
	l := startEngine(t, spec)
	waitTail(t, l.LaunchDir, "listening")

	own, err := OwnNetns(l.Engine)
	if err != nil || !own {
		t.Fatalf("OwnNetns(engine) = %v, %v; want a namespace of its own", own, err)
	}
	if own, err := OwnNetns(l.Shim); err != nil || own {
		t.Fatalf("OwnNetns(shim) = %v, %v; the shim stays in the host's namespace", own, err)
	}
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		c.Close()
		t.Fatalf("something listens on the host's 127.0.0.1:%d: the engine is not in a namespace of its own", port)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial on the host: %v, want connection refused", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := DialNetns(ctx, l.Engine, port)
	if err != nil {
		t.Fatalf("DialNetns: %v", err)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Errorf("write through the namespace: %v", err)
	}
	c.Close()
	// The dialing thread came back: this process still reaches its own
	// loopback listeners.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for range 20 {
		if c, err := DialNetns(ctx, l.Engine, port); err == nil {
			c.Close()
		}
		hc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("host loopback after DialNetns: %v", err)
		}
		hc.Close()
	}
	// Nothing listens on another port in the engine's namespace.
	if c, err := DialNetns(ctx, l.Engine, ln.Addr().(*net.TCPAddr).Port); err == nil {
		c.Close()
		t.Fatal("DialNetns reached the host's listener")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("DialNetns to a closed port: %v, want connection refused", err)
	}
}

// DialNetns refuses a process that shares this namespace (its connection
// would reach the host's loopback) and a recorded identity whose PID was
// reused.
func TestDialNetns_Refusals(t *testing.T) {
	if !NetnsSupported() {
		t.Skip("entering a network namespace needs root and a kernel that lets it make one")
	}
	self := Identity{PID: os.Getpid()}
	self.StartTicks, _ = ReadStartTicks(self.PID)
	ctx := context.Background()
	if c, err := DialNetns(ctx, self, 1); err == nil {
		c.Close()
		t.Fatal("DialNetns into the host's own namespace was not refused")
	}
	stale := Identity{PID: self.PID, StartTicks: self.StartTicks + 1}
	if _, err := DialNetns(ctx, stale, 1); !errors.Is(err, ErrIdentityMismatch) {
		t.Fatalf("DialNetns with a reused PID: %v, want ErrIdentityMismatch", err)
	}
}
