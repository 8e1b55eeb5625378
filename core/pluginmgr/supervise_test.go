// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/sdk"
)

func TestRelaunchBackoff(t *testing.T) {
	cases := []struct {
		failures int
		max      time.Duration
		want     time.Duration
	}{
		{failures: 1, max: 10 * time.Second, want: 200 * time.Millisecond},
		{failures: 2, max: 10 * time.Second, want: 400 * time.Millisecond},
		{failures: 5, max: 10 * time.Second, want: 3200 * time.Millisecond},
		{failures: 7, max: 10 * time.Second, want: 10 * time.Second},
		{failures: 100, max: time.Minute, want: 25600 * time.Millisecond}, // the shift stops at 8
		{failures: 3, max: 500 * time.Millisecond, want: 500 * time.Millisecond},
	}
	for _, c := range cases {
		if got := relaunchBackoff(c.failures, c.max); got != c.want {
			t.Errorf("relaunchBackoff(%d, %s) = %s, want %s", c.failures, c.max, got, c.want)
		}
	}
}

// TestManager_WatchRelaunchesACrashedDriver: a driver killed outright is
// relaunched by the supervisor (not at the next call), the core is told
// once, its record names the new process, and the other family is left
// alone. Watch returns when its context ends.
func TestManager_WatchRelaunchesACrashedDriver(t *testing.T) {
	r := newRig(t)
	relaunched := make(chan string, 4)
	m := r.manager(Deadlines{}, func(f string) { relaunched <- f })
	defer m.Shutdown(false)
	mustDriver(t, m, "alpha")
	mustDriver(t, m, "beta")
	crashed, beta := m.PID("alpha"), m.PID("beta")
	gen := m.Generation("alpha")

	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan struct{})
	go func() { defer close(watching); m.Watch(ctx, 20*time.Millisecond) }()
	if err := syscall.Kill(crashed, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a relaunched alpha", func() bool { p := m.PID("alpha"); return p > 0 && p != crashed })
	select {
	case f := <-relaunched:
		if f != "alpha" {
			t.Fatalf("relaunch reported for %s", f)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no relaunch reported")
	}
	if g := m.Generation("alpha"); g != gen+1 {
		t.Fatalf("generation %d after one relaunch, want %d", g, gen+1)
	}
	if rec := r.record("alpha"); rec.Pid != m.PID("alpha") {
		t.Fatalf("reattach record names pid %d, the driver is %d", rec.Pid, m.PID("alpha"))
	}
	if m.PID("beta") != beta {
		t.Fatal("the other driver was relaunched")
	}
	if _, err := mustDriver(t, m, "alpha").Flags(context.Background(), &sdk.FlagsRequest{}); err != nil {
		t.Fatalf("a call to the relaunched driver: %v", err)
	}
	cancel()
	select {
	case <-watching:
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not return once its context ended")
	}
	if len(relaunched) != 0 {
		t.Fatalf("relaunch reported again: %s", <-relaunched)
	}
}
