// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package servers_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/freeze"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestServers_AFrozenLeaderHangsNoMutation replays the fleet-trust
// review's M4 on three server processes: a follower that relayed a
// mutation to the leader keeps the connection pooled; the leader is
// frozen (SIGSTOP); the next mutation through the follower used to hang
// on that connection for as long as the leader stayed frozen, while the
// others had elected a new leader in seconds. Now it comes back with
// not_leader (exit 28) once the follower knows the leader changed, or is
// served by the new leader, and a retry is served.
func TestServers_AFrozenLeaderHangsNoMutation(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}}
	s1 := harness.StartFirstServer(t, "s1", 3, fast)
	s2 := harness.JoinServer(t, s1, "s2", fast)
	s3 := harness.JoinServer(t, s2, "s3", fast)
	poll.Until(t, 30*time.Second, "three voters caught up", func() bool { return e2e.CaughtUp(s3, 3) && e2e.CaughtUp(s2, 3) })
	byName := map[string]*harness.Role{"s1": s1, "s2": s2, "s3": s3}
	leader := byName[e2e.LeaderOf(s2)]
	if leader == nil {
		t.Fatalf("no leader known to s2")
	}
	var follower *harness.Role
	for _, r := range []*harness.Role{s1, s2, s3} {
		if r != leader {
			follower = r
			break
		}
	}
	// A mutation through the follower: its connection to the leader stays
	// in the pool.
	if _, errOut, code := boundedCLI(t, follower, 30*time.Second, "create", "join-token"); code != 0 {
		t.Fatalf("create join-token through the follower: exit %d\n%s", code, errOut)
	}

	pid := leader.PID()
	freeze.Process(t, pid)
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()

	// The bound is far above raft's election (about 2 s here) and far
	// below the frozen leader's time: a relay that waits on the frozen
	// leader does not return within it.
	_, errOut, code := boundedCLI(t, follower, 60*time.Second, "create", "join-token")
	switch {
	case code == 0:
		t.Logf("the mutation reached the new leader at once")
	case code == 28 && strings.Contains(errOut, "not_leader"):
		t.Logf("the mutation was refused not_leader: %s", strings.TrimSpace(errOut))
	default:
		t.Fatalf("a mutation through the follower while the leader is frozen: exit %d, want 0 or 28 not_leader\n%s", code, errOut)
	}
	// A retry is served by the new leader.
	poll.Until(t, 30*time.Second, "a retry through the follower is served", func() bool {
		_, _, code := boundedCLI(t, follower, 60*time.Second, "create", "join-token")
		return code == 0
	})
	if now := e2e.LeaderOf(follower); now == "" || byName[now] == leader {
		t.Fatalf("the follower's leader after the retry: %q", now)
	}
}
