// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/freeze"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestServers_StaleLeaderFenced: a leader's word delayed past its term
// changes nothing on a host.
//
//   - Three servers; a host whose link to the leader s1 goes through a
//     proxy (its --server), and directly to the others; a deployment ready
//     on it.
//   - The proxy holds what s1 sends the host. An operator stops the
//     deployment through s1: the change commits (s2 and s3 apply it) and s1
//     sends the host its share, which the proxy holds.
//   - s1 is paused (SIGSTOP: a leader frozen as a GC pause or a partition
//     freezes it); s2 and s3 elect a new leader of a newer term, which
//     sends the host the committed share (stopped), and an operator starts
//     the deployment again through it: ready again.
//   - s1 resumes and the proxy delivers the share s1 sent in its term: the
//     host refuses it (stale_term, in its log) and the deployment stays
//     ready, its engine untouched. Without the fence, that late share
//     would stop it.
func TestServers_StaleLeaderFenced(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}}
	s1 := harness.StartFirstServer(t, "s1", 3, fast)
	s2 := harness.JoinServer(t, s1, "s2", fast)
	s3 := harness.JoinServer(t, s1, "s3", fast)
	poll.Until(t, 20*time.Second, "three voters caught up", func() bool { return e2e.CaughtUp(s3, 3) })
	if e2e.LeaderOf(s1) != "s1" {
		t.Fatalf("s1 does not lead: %s", e2e.LeaderOf(s1))
	}
	token, cluster := s1.JoinToken("")
	proxy := harness.NewPartition(t, cluster)
	host := harness.StartHostWith(t, proxy.Addr(), token, harness.HostOptions{Name: "gpu-a", Options: fast})
	for _, r := range []*harness.Role{s1, s2, s3} {
		poll.Until(t, 20*time.Second, "every server has the host ready", func() bool { return hostHas(r, "gpu-a", "") })
	}
	s1.AddFakeEngine("fake")
	poll.Until(t, 15*time.Second, "the host registered the engine", func() bool { return hostHas(s2, "gpu-a", "fake") })
	host.WriteFile("models/demo/README", "fake model\n")
	if out, errOut, code := s1.Deploy("demo", harness.SimpleSpec("demo", "fake"), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}

	// s1's word to the host held; its stop committed.
	proxy.Cut(false)
	held := proxy.HeldFromTarget()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := exec.CommandContext(ctx, s1.Bin, "stop", "deployment", "demo", "--state-dir", s1.StateDir)
	if err := stop.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = stop.Wait() }()
	poll.Until(t, 15*time.Second, "the stop committed (s2 applied it)", func() bool { return e2e.Status(t, s2, "demo").Desired == "stopped" })
	// A share is a few hundred bytes at least, the acknowledgements of a
	// few heartbeats far less.
	poll.Until(t, 15*time.Second, "s1 sent the host its share, held by the proxy", func() bool { return proxy.HeldFromTarget()-held > 300 })

	freeze.Process(t, s1.PID())
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(s1.PID(), syscall.SIGCONT)
		}
	}()
	var next *harness.Role
	poll.Until(t, 30*time.Second, "s2 and s3 elect a new leader", func() bool {
		switch e2e.LeaderOf(s2) {
		case "s2":
			next = s2
		case "s3":
			next = s3
		}
		return next != nil
	})
	poll.Until(t, 30*time.Second, "the new leader's share stopped the deployment", func() bool {
		st := e2e.Status(t, next, "demo")
		return len(st.Instances) == 1 && st.Instances[0].State == "stopped"
	})
	if _, errOut, code := next.CLI("start", "deployment", "demo", "--wait"); code != 0 {
		t.Fatalf("start demo through the new leader: exit %d\n%s", code, errOut)
	}
	engines := harness.EnginePIDs(host.StateDir)
	if len(engines) != 1 {
		t.Fatalf("engines on the host: %v", engines)
	}

	// s1 resumes; its held share reaches the host.
	if err := syscall.Kill(s1.PID(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	proxy.Heal()
	poll.Until(t, 30*time.Second, "the host refused the deposed leader's share", func() bool {
		return strings.Contains(host.Output(), "refused a desired state from a deposed leader")
	})
	poll.Until(t, 30*time.Second, "s1 follows the new leader", func() bool { return e2e.LeaderOf(s1) == next.Info.Host })
	st := e2e.Status(t, next, "demo")
	if len(st.Instances) != 1 || st.Instances[0].State != "ready" {
		t.Fatalf("demo after the stale share: %+v", st.Instances)
	}
	if now := harness.EnginePIDs(host.StateDir); len(now) != 1 || now[0] != engines[0] {
		t.Fatalf("the host's engine changed after the stale share: %v, was %v", now, engines)
	}
	e2e.ChatOK(t, next, "demo")
}
