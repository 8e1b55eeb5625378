// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// hostsOn is `list hosts --json` on r (nil when it fails).
func hostsOn(r *harness.Role) []wire.Host {
	out, _, code := r.CLI("list", "hosts", "--json")
	var hosts []wire.Host
	if code != 0 || json.Unmarshal([]byte(out), &hosts) != nil {
		return nil
	}
	return hosts
}

// hostHas reports whether r lists host ready with engine registered.
func hostHas(r *harness.Role, host, engine string) bool {
	for _, h := range hostsOn(r) {
		if h.Name == host && h.State == wire.HostReady && (engine == "" || slices.Contains(h.Engines, engine)) {
			return true
		}
	}
	return false
}

// chatWithKey sends one chat through r's endpoint with key.
func chatWithKey(r *harness.Role, key, model string) int {
	req, _ := http.NewRequest(http.MethodPost, r.InferenceURL()+"/v1/chat/completions", strings.NewReader(harness.ChatBody(model, false, "hi")))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServers_TrustIsTheClusters follows the several-machines and HA
// guides' commands on three servers:
//
//   - one API key and one admin token for the cluster: a joined server
//     holds the first one's, and a client's key works through any server;
//   - a host's join token made on a follower joins through another
//     server;
//   - an engine added on the cluster reaches the host linked now and a
//     host that joins later (before, it had none and the deploy failed
//     capacity_blocked); a deploy of an engine no host has is refused
//     engine_not_found (exit 16), not capacity_blocked;
//   - a host removed through one server is refused by every server and
//     stops (exit 3).
func TestServers_TrustIsTheClusters(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}}
	s1 := harness.StartFirstServer(t, "s1", 3, fast)
	s2 := harness.JoinServer(t, s1, "s2", fast)
	s3 := harness.JoinServer(t, s2, "s3", fast)
	poll.Until(t, 20*time.Second, "three voters caught up", func() bool { return e2e.CaughtUp(s3, 3) })
	for _, r := range []*harness.Role{s2, s3} {
		if *r.Creds != *s1.Creds {
			t.Fatalf("server %s holds credentials of its own", r.Info.Host)
		}
	}

	follower := s2
	if e2e.LeaderOf(s2) == "s2" {
		follower = s3
	}
	token, _ := follower.JoinToken("")
	a := harness.StartHostWith(t, s3.ClusterAddr, token, harness.HostOptions{Name: "gpu-a", Options: fast})
	for _, r := range []*harness.Role{s1, s2, s3} {
		poll.Until(t, 20*time.Second, "every server lists gpu-a ready", func() bool { return hostHas(r, "gpu-a", "") })
	}
	s1.AddFakeEngine("fake")
	poll.Until(t, 15*time.Second, "gpu-a registered the engine", func() bool { return hostHas(s3, "gpu-a", "fake") })

	token, cluster := s3.JoinToken("")
	b := harness.StartHostWith(t, cluster, token, harness.HostOptions{Name: "gpu-b", Options: fast})
	poll.Until(t, 20*time.Second, "the host that joined later has the engine", func() bool { return hostHas(s2, "gpu-b", "fake") })
	b.WriteFile("models/demo/README", "fake model\n")
	demo := strings.Replace(harness.SimpleSpec("demo", "fake"), "  engine = ", "  placement {\n    hosts = [\"gpu-b\"]\n  }\n  engine = ", 1)
	if out, errOut, code := s2.Deploy("demo", demo); code != 0 {
		t.Fatalf("deploy on the late host: exit %d\n%s%s", code, out, errOut)
	}
	poll.Until(t, 20*time.Second, "s1's key answers through s3", func() bool { return chatWithKey(s3, s1.Creds.APIKey, "demo") == http.StatusOK })

	missing := strings.Replace(harness.SimpleSpec("lost", "fake"), `engine = "fake"`, `engine = "nope"`, 1)
	if _, errOut, code := s1.Deploy("lost", missing); code != 16 || !strings.Contains(errOut, "engine_not_found") {
		t.Fatalf("a deploy of an engine no host has: exit %d, want 16 engine_not_found\n%s", code, errOut)
	}

	if _, errOut, code := s3.CLI("remove", "host", "gpu-a"); code != 0 {
		t.Fatalf("remove host gpu-a through s3: exit %d\n%s", code, errOut)
	}
	if code := a.WaitExit(60 * time.Second); code != 3 {
		t.Fatalf("the removed host exited %d, want 3\n%s", code, a.Output())
	}
	for _, r := range []*harness.Role{s1, s2, s3} {
		if slices.Contains(e2e.HostNames(t, r), "gpu-a") {
			t.Fatalf("server %s still lists the removed host", r.Info.Host)
		}
	}
}

// TestServers_HostsSurviveARestore follows the HA guide's backup and
// restore: the state saved; a fresh server started from the old CA; the
// host pointed at it before the restore waits (host_unknown, retried),
// instead of exiting as it once did, and is taken once the state is
// restored.
func TestServers_HostsSurviveARestore(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}}
	s1 := harness.StartServer(t, fast)
	h := harness.StartHost(t, s1, harness.HostOptions{Name: "gpu-a", Options: fast})
	poll.Until(t, 15*time.Second, "gpu-a ready", func() bool { return hostHas(s1, "gpu-a", "") })
	file := filepath.Join(t.TempDir(), "state.snap")
	if _, errOut, code := s1.CLI("snapshot", "save", file); code != 0 {
		t.Fatalf("snapshot save: exit %d\n%s", code, errOut)
	}
	s1.Stop()

	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pki.CACertFile, pki.CAKeyFile} {
		data, err := os.ReadFile(filepath.Join(s1.StateDir, "pki", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "pki", f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n1 := harness.StartServer(t, harness.Options{StateDir: dir, Args: fast.Args})
	h.Stop()
	h.Args = append(withoutFlags(h.Args, "--server"), "--server", n1.ClusterAddr)
	h.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h.Output(), "host_unknown") {
		if time.Now().After(deadline) {
			t.Fatalf("the host was not told it is not known yet\n%s", h.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if h.Exited() {
		t.Fatalf("the host exited before the restore\n%s", h.Output())
	}
	if _, errOut, code := n1.CLI("snapshot", "restore", file); code != 0 {
		t.Fatalf("snapshot restore: exit %d\n%s", code, errOut)
	}
	poll.Until(t, 30*time.Second, "the restored server takes the host", func() bool { return hostHas(n1, "gpu-a", "") })
	if h.Exited() {
		t.Fatalf("the host exited\n%s", h.Output())
	}
}
