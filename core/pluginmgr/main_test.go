// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
	"github.com/capyctl/capyctl/sdk"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
	"github.com/capyctl/capyctl/sdk/proc"
)

// helperEnv selects what the test binary does when re-executed: "driver"
// serves testDriver through sdk/plugin.Serve (a real driver process, as
// `capyctl driver <family>` is); "connect" dials the unix socket named by
// its last argument and exits 0 when connected, 3 when refused for
// permissions, 4 otherwise.
const helperEnv = "CAPYCTL_PLUGINMGR_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		// The package fails when a goroutine outlives its tests: every
		// goroutine the manager starts has an owner that stops it.
		goleak.VerifyTestMain(m)
	case "driver":
		if os.Args[len(os.Args)-1] == malformedFamily {
			sdkplugin.Serve(malformedDriver{})
		}
		sdkplugin.Serve(testDriver{})
	case "connect":
		os.Exit(connect(os.Args[len(os.Args)-1]))
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
		os.Exit(2)
	}
}

func connect(path string) int {
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return 0
	}
	fmt.Fprintln(os.Stderr, err)
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		return 3
	}
	return 4
}

// testDriver answers Describe with its own dumpable flag (what the served
// process set for itself), Flags and Start with fixed answers.
type testDriver struct{ sdk.UnimplementedDriver }

func (testDriver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	dumpable, err := proc.Dumpable()
	if err != nil {
		return nil, err
	}
	return &sdk.DescribeResponse{Name: "test", Version: "dumpable=" + strconv.FormatBool(dumpable), Protocol: sdk.ProtocolVersion}, nil
}

func (testDriver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return &sdk.FlagsResponse{}, nil
}

func (testDriver) Start(_ context.Context, r *sdk.StartRequest) (*sdk.StartResponse, error) {
	// A well-formed launch: a process group and its processes (this
	// driver's own, which no test signals through it).
	return &sdk.StartResponse{Launch: sdk.Launch{LaunchID: r.Launch.LaunchID, Pgid: int32(syscall.Getpgrp()),
		Processes: []*sdk.ProcessIdentity{{Pid: int32(os.Getpid()), Role: "engine"}}}}, nil
}

// rig is a state directory with a store, and managers over it that launch
// the test binary as the drivers "alpha" and "beta".
type rig struct {
	t     *testing.T
	dir   string
	store *store.Store
	// sockets overrides the socket directory (default run/plugins).
	sockets string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	// A state directory other users can traverse, so that only the
	// socket directory and the socket keep them out.
	dir, err := os.MkdirTemp("", "pluginmgr-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &rig{t: t, dir: dir, store: st}
}

func (r *rig) socketDir() string {
	if r.sockets != "" {
		return r.sockets
	}
	return filepath.Join(r.dir, "run", "plugins")
}

// manager returns a Manager over the rig's state, as a core would make it.
// Its drivers are killed when the test ends, whatever the test did.
func (r *rig) manager(d Deadlines, onRelaunch func(string)) *Manager {
	exe, err := os.Executable()
	if err != nil {
		r.t.Fatal(err)
	}
	m := New(Config{
		Executable: exe,
		Builtins:   []string{"alpha", "beta"},
		LogDir:     filepath.Join(r.dir, "logs", "drivers"),
		SocketDir:  r.socketDir(),
		Store:      r.store,
		Env:        []string{helperEnv + "=driver"},
		Deadlines:  d,
		OnRelaunch: onRelaunch,
	})
	r.t.Cleanup(func() {
		for _, f := range []string{"alpha", "beta"} {
			if pid := m.PID(f); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		m.dropConnections()
	})
	return m
}

// dropConnections closes the manager's gRPC connections, as the death of
// its process would: a test that plays a core dying "without a word"
// leaves its first manager as is, and goleak would find that manager's
// connection goroutines still waiting on the killed drivers.
func (m *Manager) dropConnections() {
	m.mu.Lock()
	procs := make([]*driverProc, 0, len(m.drivers))
	for _, d := range m.drivers {
		procs = append(procs, d)
	}
	m.mu.Unlock()
	for _, d := range procs {
		d.mu.Lock()
		if d.conn != nil {
			_ = d.conn.Close()
		}
		d.mu.Unlock()
	}
}

// record returns a driver's reattach record.
func (r *rig) record(family string) *store.ReattachRecord {
	r.t.Helper()
	rec, err := r.store.GetReattach(family)
	if err != nil {
		r.t.Fatalf("reattach record of %s: %v", family, err)
	}
	return rec
}

func mustDriver(t *testing.T, m *Manager, family string) sdk.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := m.Driver(ctx, family)
	if err != nil {
		t.Fatalf("driver %s: %v", family, err)
	}
	return d
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 30*time.Second, what, cond)
}
