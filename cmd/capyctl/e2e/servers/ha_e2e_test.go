// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package servers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
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

// boundedCLI runs a capyctl command against r and fails the test when it
// has not returned within bound: a refusal must come back, not hang.
func boundedCLI(t *testing.T, r *harness.Role, bound time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.Bin, append(args, "--state-dir", r.StateDir)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("capyctl %v did not return within %s", args, bound)
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run capyctl %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// freePort returns a loopback address no listener holds now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServers_RollingRestartQuorumLossSnapshot runs three server
// processes, a host and a deployment through an operator's day:
//
//   - a follower partitioned (a proxy in front of its cluster address
//     holds what the others send it): it answers reads, refuses a
//     mutation with not_leader once it knows no leader, misses a deploy
//     the two others commit, and catches up once healed;
//   - a rolling restart of the three servers, one at a time, each waited
//     for until it is back with the leader's applied index: the
//     deployment survives and a mutation is accepted at the end;
//   - loss of quorum (two servers killed with kill -9): the survivor
//     answers reads (list deployments, list hosts, status deployment) and
//     saves a snapshot; a mutation is refused with not_leader (exit 28)
//     promptly; one server back restores the quorum and a mutation is
//     accepted;
//   - the snapshot restored into a fresh cluster of two servers started
//     from the old cluster's CA (a copy of its pki directory): a corrupted
//     copy is refused with snapshot_invalid, the file itself restored
//     through a follower, and both new servers list the deployment and
//     the host.
func TestServers_RollingRestartQuorumLossSnapshot(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}}
	s1 := harness.StartFirstServer(t, "s1", 3, fast)
	s2 := harness.JoinServer(t, s1, "s2", fast)
	// s3's cluster address is behind a proxy that can cut what the
	// others send it (its advertised address): raft's traffic to it.
	s3Port := freePort(t)
	proxy := harness.NewPartition(t, s3Port)
	s3 := harness.JoinServer(t, s1, "s3", harness.Options{Args: append([]string{"--cluster-listen", s3Port,
		"--set", "cluster_advertise=" + proxy.Addr()}, fast.Args...)})
	servers := []*harness.Role{s1, s2, s3}
	poll.Until(t, 20*time.Second, "three voters caught up", func() bool { return e2e.CaughtUp(s3, 3) })

	token, cluster := s1.JoinToken("")
	host := harness.StartHostWith(t, cluster, token, harness.HostOptions{Name: "gpu-a",
		GPU: harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}})
	token, cluster = s1.JoinToken("")
	host2 := harness.StartHostWith(t, cluster, token, harness.HostOptions{Name: "gpu-b",
		GPU: harness.SimGPU{DeviceMemory: "24GiB", SystemLimit: "16GiB", SystemReserve: "1GiB"}})
	s1.AddFakeEngine("fake")
	poll.Until(t, 15*time.Second, "the host lists the fake engine", func() bool {
		out, _, code := s1.CLI("list", "hosts", "--json")
		var hosts []wire.Host
		if code != 0 || json.Unmarshal([]byte(out), &hosts) != nil || len(hosts) != 2 {
			return false
		}
		return slices.Contains(hosts[0].Engines, "fake") && slices.Contains(hosts[1].Engines, "fake")
	})
	host.WriteFile("models/demo/README", "fake model\n")
	host2.WriteFile("models/demo/README", "fake model\n")
	demo := strings.Replace(harness.SimpleSpec("demo", "fake"), "  engine = ", "  instances = 2\n  engine = ", 1)
	if out, errOut, code := s1.Deploy("demo", demo); code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s", code, out, errOut)
	}

	for _, r := range servers {
		poll.Until(t, 10*time.Second, "every server lists demo", func() bool {
			names, ok := e2e.DeploymentNames(t, r)
			return ok && slices.Contains(names, "demo")
		})
	}
	// The host links to every server: each one routes demo.
	for i, r := range servers {
		poll.Until(t, 20*time.Second, fmt.Sprintf("a chat through server %d answers", i+1), func() bool { return e2e.ChatAnswers(r, "demo") })
	}

	// A follower partitioned: s3 hears nothing from the others. It keeps
	// answering reads, refuses mutations with not_leader once it knows no
	// leader; the two others commit a deploy; healed, s3 catches up.
	if e2e.LeaderOf(s1) == "s3" {
		t.Fatal("s3 leads: cutting its inbound traffic would not partition it")
	}
	proxy.Cut(false)
	poll.Until(t, 20*time.Second, "the partitioned s3 knows no leader", func() bool {
		list, err := s3.Servers()
		return err == nil && list.Leader == ""
	})
	if _, errOut, code := boundedCLI(t, s3, 30*time.Second, "drain", "host", "gpu-a"); code != 28 || !strings.Contains(errOut, "not_leader") {
		t.Fatalf("a mutation on the partitioned follower: exit %d, want 28 not_leader\n%s", code, errOut)
	}
	if names, ok := e2e.DeploymentNames(t, s3); !ok || !slices.Contains(names, "demo") {
		t.Fatalf("the partitioned follower lists %v", names)
	}
	host.WriteFile("models/demo2/README", "fake model\n")
	host2.WriteFile("models/demo2/README", "fake model\n")
	if out, errOut, code := s2.Deploy("demo2", harness.SimpleSpec("demo2", "fake")); code != 0 {
		t.Fatalf("deploy on the majority side: exit %d\n%s%s", code, out, errOut)
	}
	if names, _ := e2e.DeploymentNames(t, s3); slices.Contains(names, "demo2") {
		t.Fatal("the partitioned follower lists a deployment committed without it")
	}
	healed := time.Now()
	proxy.Heal()
	poll.Until(t, 30*time.Second, "the healed s3 caught up", func() bool {
		names, ok := e2e.DeploymentNames(t, s3)
		return ok && slices.Contains(names, "demo2") && e2e.CaughtUp(s3, 3)
	})
	t.Logf("partition healed: s3 caught up (demo2 listed, the leader's applied index) after %s", time.Since(healed).Round(time.Millisecond))

	// Rolling restart: each server stopped (SIGTERM) and started again on
	// its state directory; the next one only once it caught up and routes
	// again (the host relinked to it).
	for i, r := range servers {
		poll.Until(t, 20*time.Second, fmt.Sprintf("a chat through server %d answers", i+1), func() bool { return e2e.ChatAnswers(r, "demo") })
	}
	for i, r := range servers {
		start := time.Now()
		r.Stop()
		// Requests through the two others go on while it is away.
		for j, o := range servers {
			if j != i && !e2e.ChatAnswers(o, "demo") {
				t.Fatalf("rolling restart: with server %d away, a chat through server %d failed", i+1, j+1)
			}
		}
		r.Restart()
		poll.Until(t, 30*time.Second, "restarted server caught up", func() bool { return e2e.CaughtUp(r, 3) })
		poll.Until(t, 20*time.Second, "restarted server routes", func() bool { return e2e.ChatAnswers(r, "demo") })
		t.Logf("rolling restart: server %d back as a voter with the leader's applied index after %s", i+1, time.Since(start).Round(time.Millisecond))
	}
	for i, r := range servers {
		if names, ok := e2e.DeploymentNames(t, r); !ok || !slices.Contains(names, "demo") {
			t.Fatalf("after the rolling restart server %d lists %v", i+1, names)
		}
	}
	poll.Until(t, 20*time.Second, "a mutation accepted after the rolling restart", func() bool {
		_, _, code := s2.CLI("drain", "host", "gpu-a")
		return code == 0
	})

	// Loss of quorum: the leader and one follower killed.
	leader := e2e.LeaderOf(s1)
	var survivor *harness.Role
	var killed []*harness.Role
	for i, r := range servers {
		name := []string{"s1", "s2", "s3"}[i]
		if name != leader && survivor == nil {
			survivor = r
			continue
		}
		killed = append(killed, r)
	}
	for _, r := range killed {
		r.Kill9()
	}
	lost := time.Now()
	if names, ok := e2e.DeploymentNames(t, survivor); !ok || !slices.Contains(names, "demo") {
		t.Fatalf("without quorum the survivor lists deployments %v", names)
	}
	if names := e2e.HostNames(t, survivor); !slices.Contains(names, "gpu-a") {
		t.Fatalf("without quorum the survivor lists hosts %v", names)
	}
	if out, errOut, code := survivor.CLI("status", "deployment", "demo"); code != 0 {
		t.Fatalf("without quorum status deployment: exit %d\n%s%s", code, out, errOut)
	}
	// Routing to the instances the survivor knows goes on.
	for i := 0; i < 5; i++ {
		if !e2e.ChatAnswers(survivor, "demo") {
			t.Fatalf("without quorum a chat through the survivor failed (request %d)", i+1)
		}
	}
	// Refused while the survivor still names the dead leader (the relay
	// fails), and once it knows none (an election it cannot win).
	var slowest time.Duration
	refuse := func() {
		start := time.Now()
		_, errOut, code := boundedCLI(t, survivor, 30*time.Second, "drain", "host", "gpu-a", "--resume")
		slowest = max(slowest, time.Since(start))
		if code != 28 || !strings.Contains(errOut, "not_leader") {
			t.Fatalf("a mutation without quorum: exit %d, want 28 not_leader\n%s", code, errOut)
		}
	}
	refuse()
	poll.Until(t, 20*time.Second, "the survivor knows no leader", func() bool { return e2e.LeaderOf(survivor) == "" })
	refuse()
	refuse()
	file := filepath.Join(t.TempDir(), "state.snap")
	if out, errOut, code := survivor.CLI("snapshot", "save", file); code != 0 {
		t.Fatalf("snapshot save without quorum: exit %d\n%s%s", code, out, errOut)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the snapshot file: %v %v, want mode 0600", fi, err)
	}
	back := time.Now()
	killed[0].Restart()
	var accepted time.Duration
	poll.Until(t, 30*time.Second, "a mutation accepted once quorum is back", func() bool {
		_, _, code := survivor.CLI("drain", "host", "gpu-a", "--resume")
		accepted = time.Since(back)
		return code == 0
	})
	t.Logf("quorum lost for %s: every mutation refused with not_leader (exit 28), the slowest refusal (the whole CLI call) in %s; one server restarted: a mutation accepted after %s",
		back.Sub(lost).Round(time.Millisecond), slowest.Round(time.Millisecond), accepted.Round(time.Millisecond))

	// A fresh cluster from the old CA.
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
	n1 := harness.StartFirstServer(t, "n1", 2, harness.Options{StateDir: dir})
	n2 := harness.JoinServer(t, n1, "n2", harness.Options{})
	poll.Until(t, 20*time.Second, "the fresh cluster's two voters caught up", func() bool { return e2e.CaughtUp(n2, 2) })

	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.snap")
	if err := os.WriteFile(bad, bytes.Replace(data, []byte(`gpu-a`), []byte(`gpu-b`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := n2.CLI("snapshot", "restore", bad); code != 2 || !strings.Contains(errOut, "snapshot_invalid") {
		t.Fatalf("restore of a changed file: exit %d, want 2 snapshot_invalid\n%s", code, errOut)
	}
	if out, errOut, code := n2.CLI("snapshot", "restore", file); code != 0 {
		t.Fatalf("snapshot restore through a follower: exit %d\n%s%s", code, out, errOut)
	}
	for _, r := range []*harness.Role{n1, n2} {
		poll.Until(t, 10*time.Second, "the fresh cluster lists the restored deployment and host", func() bool {
			names, ok := e2e.DeploymentNames(t, r)
			return ok && slices.Contains(names, "demo") && slices.Contains(e2e.HostNames(t, r), "gpu-a")
		})
	}
}
