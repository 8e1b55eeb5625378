// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package servers_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestServers_ThreeServersOneState runs three server processes as one
// raft cluster: they form it (first server with --bootstrap-expect 3, two
// joining with server join tokens), a host joins with a token made on a
// follower, a deploy through a follower lands and every server lists it;
// a kill -9 of the leader elects another (the time without a leader is
// logged), every deployment is still listed, a mutation is accepted again
// on a survivor, and the killed server restarts and catches up.
func TestServers_ThreeServersOneState(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}}
	s1 := harness.StartFirstServer(t, "s1", 3, fast)
	s2 := harness.JoinServer(t, s1, "s2", fast)
	// s3 is given two addresses, the first one dead: it goes on to s2, a
	// follower, which sends it on to the leader.
	dead := freePort(t)
	s3 := harness.JoinServer(t, s2, "s3", harness.Options{Args: append([]string{"--join", dead + "," + s2.ClusterAddr}, fast.Args...)})
	servers := map[string]*harness.Role{"s1": s1, "s2": s2, "s3": s3}

	poll.Until(t, 20*time.Second, "three voters, one leader, seen from s3", func() bool {
		list, err := s3.Servers()
		if err != nil || list.Voters != 3 || list.Degraded || list.Leader == "" || len(list.Servers) != 3 {
			return false
		}
		leaders := 0
		for _, s := range list.Servers {
			if s.State == "leader" {
				leaders++
			}
			if s.State != "leader" && s.State != "follower" {
				return false
			}
		}
		return leaders == 1
	})
	leader := e2e.LeaderOf(s3)
	if out, errOut, code := s3.CLI("status"); code != 0 || !strings.Contains(out, "Cluster:     healthy; leader "+leader+"; 3 of 3 expected voters; this server is s3") {
		t.Fatalf("capyctl status on s3: exit %d\n%s%s", code, out, errOut)
	}
	var follower *harness.Role
	for name, r := range servers {
		if name != leader {
			follower = r
			break
		}
	}

	// A host joins with a token a follower made: the token lives on the
	// leader and names its address.
	token, cluster := follower.JoinToken("")
	if cluster != servers[leader].ClusterAddr {
		t.Fatalf("a follower's join token names %s, want the leader %s's %s", cluster, leader, servers[leader].ClusterAddr)
	}
	host := harness.StartHostWith(t, cluster, token, harness.HostOptions{Name: "gpu-a",
		GPU: harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}})
	follower.AddFakeEngine("fake") // relayed to the leader, which has the host's link
	poll.Until(t, 15*time.Second, "the host lists the fake engine", func() bool {
		out, _, code := servers[leader].CLI("list", "hosts", "--json")
		var hosts []wire.Host
		if code != 0 || json.Unmarshal([]byte(out), &hosts) != nil {
			return false
		}
		return len(hosts) == 1 && slices.Contains(hosts[0].Engines, "fake")
	})

	// A deploy through a follower lands on the host and every server
	// lists it.
	host.WriteFile("models/demo/README", "fake model\n")
	if out, errOut, code := follower.Deploy("demo", harness.SimpleSpec("demo", "fake")); code != 0 {
		t.Fatalf("deploy through follower: exit %d\n%s%s", code, out, errOut)
	}
	for name, r := range servers {
		poll.Until(t, 10*time.Second, name+" lists demo", func() bool {
			names, ok := e2e.DeploymentNames(t, r)
			return ok && slices.Contains(names, "demo")
		})
	}
	if _, _, code := host.CLI("status", "deployment", "demo"); code != 0 {
		t.Fatalf("the host does not run demo")
	}

	// kill -9 of the leader.
	old := servers[leader]
	var survivors []*harness.Role
	for name, r := range servers {
		if name != leader {
			survivors = append(survivors, r)
		}
	}
	killed := time.Now()
	old.Kill9()
	var newLeader string
	poll.Until(t, 20*time.Second, "a new leader", func() bool {
		l := e2e.LeaderOf(survivors[0])
		if l != "" && l != leader && l == e2e.LeaderOf(survivors[1]) {
			newLeader = l
			return true
		}
		return false
	})
	elected := time.Since(killed)
	for _, r := range survivors {
		names, ok := e2e.DeploymentNames(t, r)
		if !ok || !slices.Contains(names, "demo") {
			t.Fatalf("after the leader's loss a survivor lists %v", names)
		}
	}
	var accepted time.Duration
	poll.Until(t, 20*time.Second, "a mutation accepted on a survivor", func() bool {
		_, _, code := survivors[0].CLI("drain", "host", "gpu-a")
		accepted = time.Since(killed)
		return code == 0
	})
	t.Logf("leader %s killed: new leader %s seen after %s; a mutation on a survivor accepted after %s (loopback, raft's default timeouts)",
		leader, newLeader, elected.Round(time.Millisecond), accepted.Round(time.Millisecond))

	// The killed server restarts and catches up.
	old.Restart()
	poll.Until(t, 20*time.Second, "the restarted server catches up", func() bool {
		list, err := old.Servers()
		if err != nil || list.Leader != newLeader {
			return false
		}
		var self, lead wire.ServerInfo
		for _, s := range list.Servers {
			switch s.Name {
			case list.Self:
				self = s
			case newLeader:
				lead = s
			}
		}
		return self.State == "follower" && self.AppliedIndex > 0 && self.AppliedIndex >= lead.AppliedIndex
	})
	names, ok := e2e.DeploymentNames(t, old)
	if !ok || !slices.Contains(names, "demo") {
		t.Fatalf("the restarted server lists %v", names)
	}
	out, _, _ := old.CLI("list", "servers")
	t.Logf("after the restart:\n%s", out)
}
