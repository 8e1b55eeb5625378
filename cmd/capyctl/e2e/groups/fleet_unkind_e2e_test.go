// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package groups_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
)

// TestFleetGroups_SGLangHeadsShareAHost: two SGLang groups with DP
// attention whose heads both run on gpu-a. An SGLang head with DP
// attention binds six ZeroMQ ports after its rendezvous port (the fake, as
// SGLang, holds them), so heads given consecutive rendezvous ports would
// collide: the host gives each head a span of ports of its own, and both
// groups come up and answer.
func TestFleetGroups_SGLangHeadsShareAHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, two hosts and group engines")
	}
	f := e2e.StartFleet(t, map[string]string{"gpu-a": "24GiB", "gpu-b": "24GiB"})
	f.DumpOnFailure()
	venv := conformance.FakeVenv(t, t.TempDir(), map[string]string{"sglang": "0.5.22"}, nil)
	if out, errOut, code := f.Server.CLI("engine", "add", venv, "--name", "sglang", "--yes"); code != 0 {
		t.Fatalf("engine add sglang: exit %d\n%s%s", code, out, errOut)
	}
	f.WaitEngine("sglang")
	extra := strings.Replace(fmt.Sprintf(groupMemory, "4GiB", "4GiB"), "  engine_config {\n",
		"  engine_config {\n    accept_extra_args = true\n    extra_args = [\"--enable-dp-attention\"]\n", 1)
	// Both placed before either runs: their ports are picked while
	// nothing listens yet.
	for _, name := range []string{"dp1", "dp2"} {
		spec := groupSpec(name, "sglang", 2, []string{"gpu-a", "gpu-b"}, extra)
		if out, errOut, code := f.DeployEverywhere(name, spec); code != 0 {
			t.Fatalf("deploy %s: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	var rendezvous []string
	for _, name := range []string{"dp1", "dp2"} {
		if out, errOut, code := f.Server.CLI("start", "deployment", name, "--wait"); code != 0 {
			t.Fatalf("start %s: exit %d\n%s%s", name, code, out, errOut)
		}
		st := f.WaitGroup(name, "ready", time.Minute)
		if st.Group == nil || st.Instances[0].Host != "gpu-a" {
			t.Fatalf("%s: group %+v, head on %s", name, st.Group, st.Instances[0].Host)
		}
		rendezvous = append(rendezvous, st.Group.Rendezvous)
	}
	for _, name := range []string{"dp1", "dp2"} {
		e2e.ChatOK(t, f.Server, name)
	}
	if rendezvous[0] == rendezvous[1] || !strings.HasPrefix(rendezvous[1], "127.0.0.1:") {
		t.Fatalf("rendezvous addresses %v", rendezvous)
	}
}
