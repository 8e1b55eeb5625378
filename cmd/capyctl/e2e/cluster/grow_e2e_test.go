// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestServers_AServerAloneGrowsIntoACluster follows the HA guide from a
// server that already runs alone, with a host and a deployment, the way
// the operator did: restarted with --bootstrap-expect 3 (once,
// the followers then held no host and no placement, and after the first
// server's loss every request got unknown_model). Its state is in its
// log: the flag changes nothing (the cluster's expected size stays its
// first start's, 1), two servers joined with tokens made on it list the
// host and the deployment, and with the first server killed a survivor
// serves the deployment and takes a mutation.
func TestServers_AServerAloneGrowsIntoACluster(t *testing.T) {
	t.Parallel()
	fast := []string{"--set", "host_heartbeat=300ms"}
	s1 := harness.StartServer(t, harness.Options{Args: append([]string{"--hostname", "s1"}, fast...)})
	host := harness.StartHost(t, s1, harness.HostOptions{Name: "gpu-a"})
	host.WriteFile("models/demo/README", "fake model\n")
	poll.Until(t, 15*time.Second, "the host ready", func() bool { return hostHas(s1, "gpu-a", "") })
	s1.AddFakeEngine("fake")
	s1.MustDeploy("demo", harness.SimpleSpec("demo", "fake"))

	s1.Stop()
	s1.Args = append(s1.Args, "--bootstrap-expect", "3")
	s1.Restart()
	list, err := s1.Servers()
	if err != nil || !list.Raft || list.Voters != 1 || list.Expect != 1 || list.Leader != "s1" || list.Degraded {
		t.Fatalf("the server alone restarted with --bootstrap-expect 3: %+v (%v), want 1 voter of 1 expected, leader, healthy", list, err)
	}

	s2 := harness.JoinServer(t, s1, "s2", harness.Options{Args: fast})
	s3 := harness.JoinServer(t, s1, "s3", harness.Options{Args: fast})
	for _, r := range []*harness.Role{s2, s3} {
		poll.Until(t, 20*time.Second, "a joined server lists the host and the deployment", func() bool { return lists(t, r, "demo", "gpu-a") })
		// A host learns the other servers from a server it is linked to;
		// s1 is killed below only once it reached them.
		poll.Until(t, 20*time.Second, "the host linked to "+r.Info.Host, func() bool { return hostHas(r, "gpu-a", "") })
	}
	// --bootstrap-expect on the restart did not change the cluster's
	// record (1, above); the joins did: 3 of 3, healthy.
	poll.Until(t, 10*time.Second, "a joined server's view: 3 voters of 3 expected, healthy", func() bool {
		list, err := s3.Servers()
		return err == nil && list.Expect == 3 && list.Voters == 3 && !list.Degraded
	})

	s1.Kill9()
	poll.Until(t, 20*time.Second, "the survivors elect a leader", func() bool { l := e2e.LeaderOf(s2); return l == "s2" || l == "s3" })
	if list, err := s2.Servers(); err != nil || !list.Degraded {
		t.Fatalf("a survivor's view with s1 gone: %+v (%v), want degraded", list, err)
	}
	poll.Until(t, 20*time.Second, "a survivor serves the deployment", func() bool { return e2e.ChatAnswers(s3, "demo") })
	if _, errOut, code := s2.CLI("drain", "host", "gpu-a"); code != 0 {
		t.Fatalf("a mutation on a survivor: exit %d\n%s", code, errOut)
	}
}
