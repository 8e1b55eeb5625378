// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// withoutFlags drops each flag named (and its value) from args.
func withoutFlags(args []string, flags ...string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if slices.Contains(flags, args[i]) {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// lists reports whether r lists the deployment and the host.
func lists(t *testing.T, r *harness.Role, deployment, host string) bool {
	names, ok := e2e.DeploymentNames(t, r)
	return ok && slices.Contains(names, deployment) && slices.Contains(e2e.HostNames(t, r), host)
}

// TestServers_AloneIsAClusterOfOne follows a server that ran without raft
// (its state directory holds a store but no <state_dir>/raft, as a server
// of an earlier release left it) into a cluster, as the guides say:
//
//   - started again (no flag), it is a cluster of one voter, leader at
//     once, healthy; it carries the state it holds (a host, a deployment)
//     into the replicated log;
//   - two servers join it with server join tokens made on it, with no
//     restart: each lists the host and the deployment, from the log;
//   - the first server killed, a survivor serves the deployment (the
//     first cluster release answered unknown_model: its followers held
//     nothing) and takes a mutation;
//   - a joined server reports the cluster's expected size, 1 (the first
//     server's), not its own flag's.
func TestServers_AloneIsAClusterOfOne(t *testing.T) {
	t.Parallel()
	fast := harness.Options{Args: []string{"--set", "host_heartbeat=300ms", "--hostname", "s1"}}
	s1 := harness.StartServer(t, fast)
	host := harness.StartHost(t, s1, harness.HostOptions{Name: "gpu-a"})
	poll.Until(t, 15*time.Second, "the host ready", func() bool {
		out, _, code := s1.CLI("list", "hosts")
		return code == 0 && strings.Contains(out, "ready")
	})
	s1.AddFakeEngine("fake")
	host.WriteFile("models/demo/README", "fake model\n")
	s1.MustDeploy("demo", harness.SimpleSpec("demo", "fake"))

	// The state an earlier release left: the store, no raft directory.
	s1.Stop()
	if err := os.RemoveAll(filepath.Join(s1.StateDir, "raft")); err != nil {
		t.Fatal(err)
	}
	s1.Restart()
	list, err := s1.Servers()
	if err != nil || !list.Raft || list.Voters != 1 || list.Leader != "s1" || list.Degraded {
		t.Fatalf("a server alone: %+v (%v)", list, err)
	}
	poll.Until(t, 10*time.Second, "the carried state is in the log", func() bool {
		return strings.Contains(s1.Output(), "this server's state is in the replicated log")
	})

	s2 := harness.JoinServer(t, s1, "s2", harness.Options{Args: fast.Args[:2]})
	s3 := harness.JoinServer(t, s1, "s3", harness.Options{Args: fast.Args[:2]})
	for _, r := range []*harness.Role{s2, s3} {
		poll.Until(t, 20*time.Second, "a joined server lists the host and the deployment", func() bool { return lists(t, r, "demo", "gpu-a") })
	}
	// The expected size grew with the joins (the cluster's record, not
	// s2's flags): 3 of 3, healthy.
	poll.Until(t, 10*time.Second, "a joined server's view: 3 voters of 3 expected, healthy", func() bool {
		list, err := s2.Servers()
		return err == nil && list.Expect == 3 && list.Voters == 3 && !list.Degraded
	})

	// A host learns the other servers from a server it is linked to: it
	// reaches s2 and s3 only once it linked again to the restarted s1. Kill
	// s1 before that and no survivor can ever reach it.
	for _, r := range []*harness.Role{s2, s3} {
		poll.Until(t, 20*time.Second, "the host linked to a joined server", func() bool {
			out, _, code := r.CLI("list", "hosts")
			return code == 0 && strings.Contains(out, "ready")
		})
	}
	s1.Kill9()
	poll.Until(t, 20*time.Second, "the survivors elect a leader", func() bool { l := e2e.LeaderOf(s2); return l == "s2" || l == "s3" })
	poll.Until(t, 20*time.Second, "a survivor serves the deployment", func() bool { return e2e.ChatAnswers(s2, "demo") })
	if _, errOut, code := s3.CLI("drain", "host", "gpu-a"); code != 0 {
		t.Fatalf("a mutation on a survivor: exit %d\n%s", code, errOut)
	}
}

// TestServers_RestartsStayClustered: a server with raft state starts
// clustered, whatever its flags (the guides' later starts, a systemd unit
// with --config only): restarted without --join or --bootstrap-expect,
// each server is back as a voter with the leader's index, and a mutation
// through a follower is applied on every server. A removed server stops
// at once with server_removed, and refuses to start again.
func TestServers_RestartsStayClustered(t *testing.T) {
	t.Parallel()
	s1 := harness.StartFirstServer(t, "s1", 3, harness.Options{})
	s2 := harness.JoinServer(t, s1, "s2", harness.Options{})
	s3 := harness.JoinServer(t, s1, "s3", harness.Options{})
	servers := []*harness.Role{s1, s2, s3}
	poll.Until(t, 20*time.Second, "three voters caught up", func() bool { return e2e.CaughtUp(s3, 3) })
	if list, err := s2.Servers(); err != nil || list.Expect != 3 {
		t.Fatalf("a joined server's expected size: %+v (%v), want the first server's 3", list, err)
	}

	for _, r := range servers {
		r.Stop()
		r.Args = withoutFlags(r.Args, "--join", "--join-token-file", "--bootstrap-expect")
		r.Restart()
		poll.Until(t, 20*time.Second, r.Info.Host+" back in the cluster of three", func() bool { return e2e.CaughtUp(r, 3) })
	}
	follower := s1
	for _, r := range servers {
		if e2e.LeaderOf(r) != r.Info.Host {
			follower = r
			break
		}
	}
	harness.StartHost(t, follower, harness.HostOptions{Name: "gpu-a"})
	if _, errOut, code := follower.CLI("drain", "host", "gpu-a"); code != 0 {
		t.Fatalf("drain through a follower: exit %d\n%s", code, errOut)
	}
	for _, r := range servers {
		poll.Until(t, 10*time.Second, "every server applied the drain", func() bool {
			out, _, code := r.CLI("list", "hosts")
			return code == 0 && strings.Contains(out, "draining")
		})
	}

	// A removed server stops, and never starts again on its old state.
	var gone *harness.Role
	for _, r := range servers {
		if r != follower && e2e.LeaderOf(r) != r.Info.Host {
			gone = r
		}
	}
	if gone == nil {
		t.Fatal("no second follower")
	}
	name := gone.Info.Host
	if _, errOut, code := follower.CLI("remove", "server", name); code != 0 {
		t.Fatalf("remove server %s through a follower: exit %d\n%s", name, code, errOut)
	}
	if code := gone.WaitExit(30 * time.Second); code != 3 || !strings.Contains(gone.Output(), "server_removed") {
		t.Fatalf("the removed server exited %d\n%s", code, gone.Output())
	}
	// The cluster refuses it too, not only its own word: every survivor's
	// cluster listener refuses its server peer certificate (signed by the
	// cluster's CA, not expired), and takes a member's.
	for _, r := range servers {
		if r == gone {
			continue
		}
		if err := peerAnswered(t, r.ClusterAddr, follower.StateDir); err != nil {
			t.Fatalf("%s refused a member's server peer certificate: %v", r.Info.Host, err)
		}
		var err error
		poll.Until(t, 10*time.Second, r.Info.Host+" refuses the removed server's certificate at the handshake", func() bool {
			err = peerAnswered(t, r.ClusterAddr, gone.StateDir)
			return err != nil && strings.Contains(err.Error(), "tls: ")
		})
		t.Logf("%s refused the removed %s: %v", r.Info.Host, name, err)
	}
	code, out := gone.RestartExpectingFailure()
	if code != 3 || !strings.Contains(out, "server_removed") || !strings.Contains(out, "join it again") {
		t.Fatalf("the removed server's restart: exit %d\n%s", code, out)
	}
}

var (
	futureOnce sync.Once
	futureBin  string
	futureErr  error
)

// futureBinary builds capyctl with the fleetfuture tag: a pretend newer
// release whose servers know two command types this one does not.
func futureBinary(t *testing.T) string {
	t.Helper()
	futureOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capyctl-future-")
		if err != nil {
			futureErr = err
			return
		}
		futureBin = filepath.Join(dir, "capyctl")
		cmd := exec.Command("go", "build", "-tags", "fleetfuture", "-o", futureBin, "github.com/capyctl/capyctl/cmd/capyctl")
		if out, err := cmd.CombinedOutput(); err != nil {
			futureErr = err
			t.Logf("%s", out)
		}
	})
	if futureErr != nil {
		t.Fatalf("build the fleetfuture capyctl: %v", futureErr)
	}
	return futureBin
}

// TestServers_RollingUpgrade runs servers of this release beside one of a
// newer release (the fleetfuture build) in one cluster:
//
//   - the newer server, a follower, commits an ignorable command type the
//     others do not know through the leader: every server of this release
//     skips it, says so in its log, and goes on applying the log (a drain
//     after it reaches every server);
//   - a command of a newer type that is not ignorable is refused by a
//     leader of this release (it would stop the servers that cannot read
//     it): the cluster goes on;
//   - led by a server of the newer release, a cluster commits such a
//     command, and a server of this release that joins stops at it with
//     server_command_unknown (exit 5) instead of diverging.
func TestServers_RollingUpgrade(t *testing.T) {
	t.Parallel()
	future := futureBinary(t)
	s1 := harness.StartFirstServer(t, "s1", 3, harness.Options{})
	s2 := harness.JoinServer(t, s1, "s2", harness.Options{})
	s3 := harness.JoinServer(t, s1, "s3", harness.Options{})
	poll.Until(t, 20*time.Second, "three voters caught up", func() bool { return e2e.CaughtUp(s3, 3) })
	harness.StartHost(t, s1, harness.HostOptions{Name: "gpu-a"})

	// s3 upgraded first: stopped, started again with the newer binary.
	s3.Stop()
	s3.Bin = future
	s3.Env = append(s3.Env, "CAPYCTL_FUTURE_COMMAND=note")
	s3.Restart()
	poll.Until(t, 20*time.Second, "the newer server committed its note", func() bool {
		return strings.Contains(s3.Output(), "future command committed")
	})
	for _, r := range []*harness.Role{s1, s2} {
		poll.Until(t, 10*time.Second, "a server of this release skipped the note", func() bool {
			return strings.Contains(r.Output(), "skipped a command of a newer release")
		})
	}
	if _, errOut, code := s2.CLI("drain", "host", "gpu-a"); code != 0 {
		t.Fatalf("a drain after the note: exit %d\n%s", code, errOut)
	}
	for _, r := range []*harness.Role{s1, s2, s3} {
		poll.Until(t, 10*time.Second, "every server applied the drain after the note", func() bool {
			out, _, code := r.CLI("list", "hosts")
			return code == 0 && strings.Contains(out, "draining")
		})
	}

	// A newer command that may not be skipped: refused by this release's
	// leader, the cluster unharmed.
	s3.Stop()
	s3.Env = append(s3.Env, "CAPYCTL_FUTURE_COMMAND=required")
	s3.Restart()
	poll.Until(t, 20*time.Second, "the newer server's command refused", func() bool {
		return strings.Contains(s3.Output(), "future command refused") && strings.Contains(s3.Output(), "upgrade the leader")
	})
	poll.Until(t, 20*time.Second, "the cluster healthy", func() bool { return e2e.CaughtUp(s1, 3) && e2e.CaughtUp(s2, 3) })

	// A cluster a newer server leads commits it; a server of this release
	// stops at it.
	n1 := harness.StartFirstServer(t, "n1", 2, harness.Options{})
	n1.Stop()
	n1.Bin = future
	n1.Env = append(n1.Env, "CAPYCTL_FUTURE_COMMAND=required")
	n1.Restart()
	poll.Until(t, 20*time.Second, "the newer leader committed its command", func() bool {
		return strings.Contains(n1.Output(), "future command committed")
	})
	code, out := joinExpectingExit(t, n1, "n2")
	if code != 5 || !strings.Contains(out, "server_command_unknown") || !strings.Contains(out, "future_required") {
		t.Fatalf("a server of this release under a newer leader exited %d\n%s", code, out)
	}
}

// joinExpectingExit starts a server named name that joins via's cluster
// (a server join token made on via) and expects it to stop by itself
// within a minute: it returns the exit code and what it printed.
func joinExpectingExit(t *testing.T, via *harness.Role, name string) (int, string) {
	t.Helper()
	out, errOut, code := via.CLI("create", "join-token", "--role", "server", "--json")
	if code != 0 {
		t.Fatalf("create join-token --role server: exit %d: %s", code, errOut)
	}
	var tok wire.JoinToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tok.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, _ := harness.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "start", "server", "--state-dir", dir, "--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0",
		"--cluster-listen", "127.0.0.1:0", "--join", via.ClusterAddr, "--join-token-file", file, "--hostname", name)
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	var ee *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &ee) {
		t.Fatalf("server %s did not stop by itself (err %v)\n%s", name, err, b.String())
	}
	return ee.ExitCode(), b.String()
}
