// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet_test

import (
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestFleet_DeleteWhileAHostIsAway: deployments are desired state, so a
// delete is taken while a host of the deployment is cut off (before, it
// was refused host_unreachable until the host was back); the host stops
// and deletes its copy as soon as its link is back, and no engine is
// left behind.
func TestFleet_DeleteWhileAHostIsAway(t *testing.T) {
	f := &e2e.Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	token, cluster := f.Server.JoinToken("")
	proxy := harness.NewPartition(t, cluster)
	b := harness.StartHostWith(t, proxy.Addr(), token, harness.HostOptions{Name: "gpu-b"})
	f.Hosts["gpu-b"] = b
	f.WaitHosts(1, wire.HostReady)
	f.Server.AddFakeEngine("fake")
	f.WaitEngine("fake")
	b.WriteFile("models/demo/README", "fake model\n")
	if out, errOut, code := f.Deploy("demo", harness.SimpleSpec("demo", "fake"), "--activate", "--wait"); code != 0 {
		t.Fatalf("deploy demo: exit %d\n%s%s", code, out, errOut)
	}
	if len(harness.EnginePIDs(b.StateDir)) != 1 {
		t.Fatalf("engines on gpu-b: %v", harness.EnginePIDs(b.StateDir))
	}

	proxy.Cut(false)
	poll.Until(t, 15*time.Second, "gpu-b lost", func() bool { return f.HostState("gpu-b") == wire.HostLost })
	if _, errOut, code := f.Server.CLI("delete", "deployment", "demo"); code != 0 {
		t.Fatalf("delete while gpu-b is away: exit %d\n%s", code, errOut)
	}
	if out, _, _ := f.Server.CLI("list", "deployments"); strings.Contains(out, "demo") {
		t.Fatalf("the server still lists the deleted deployment:\n%s", out)
	}

	proxy.Heal()
	poll.Until(t, 30*time.Second, "gpu-b back", func() bool { return f.HostState("gpu-b") == wire.HostReady })
	poll.Until(t, 30*time.Second, "gpu-b deleted its copy and stopped its engine", func() bool {
		return len(hostDeployments(t, b)) == 0 && len(harness.EnginePIDs(b.StateDir)) == 0
	})
	if out, _, _ := f.Server.CLI("list", "deployments"); strings.Contains(out, "demo") {
		t.Fatalf("the server adopted the deleted deployment back:\n%s", out)
	}
}
