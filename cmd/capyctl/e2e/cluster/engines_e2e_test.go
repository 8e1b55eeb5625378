// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestServers_EngineBeforeAnyHost follows the guides in the order a new
// user may take them: `capyctl engine add` on a server no host has linked
// to yet. The CLI's dry run (which detects the installation on a host)
// finds no host: it is answered with a note, not host_unreachable, and the
// registration is the cluster's; the first host to link registers it.
func TestServers_EngineBeforeAnyHost(t *testing.T) {
	t.Parallel()
	s := harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	m := s.WriteFile("manifests/fake.hcl", harness.FakeManifest())
	out, errOut, code := s.CLI("engine", "add", "--custom", s.FakeBin, "--name", "fake", "--manifest", m, "--yes")
	if code != 0 {
		t.Fatalf("engine add with no host linked: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut+out, "no host is linked") {
		t.Fatalf("engine add with no host linked says nothing of it:\n%s%s", out, errOut)
	}
	harness.StartHost(t, s, harness.HostOptions{Name: "gpu-a"})
	poll.Until(t, 20*time.Second, "the host that linked after engine add has the engine", func() bool { return hostHas(s, "gpu-a", "fake") })
}
