// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// testTuning makes elections quick on loopback, yet slow enough that a
// loaded machine (a make test on two cores) does not call spurious ones.
var testTuning = raftlog.Tuning{HeartbeatTimeout: time.Second, ElectionTimeout: time.Second,
	LeaderLeaseTimeout: 500 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}

// testSecrets are a cluster's API key and admin token in these tests.
func testSecrets() ClusterSecrets {
	return ClusterSecrets{APIKey: "capy-test", AdminToken: "capyadm-test"}
}

// joinTestServer starts a server named name that joins via's cluster with
// a server join token made on via, and returns it once it is a voter.
func joinTestServer(t *testing.T, via *Server, name string) (*Server, *ClusterSecrets) {
	t.Helper()
	tok, err := via.NewServerJoinToken(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got ClusterSecrets
	s := startTestServer(t, ServerOptions{StateDir: dir, Listen: "127.0.0.1:0", Store: st, Name: name, Join: via.Advertise(), JoinToken: tok.Token,
		RaftTuning: testTuning, Secrets: testSecrets, AdoptSecrets: func(cs ClusterSecrets) error { got = cs; return nil }})
	return s, &got
}

// TestCluster_TrustIsTheClusters: the API key and admin token are handed
// to a joining server with the CA; a host's join token made on one server
// is redeemed on the other, once; a server join token made on a follower
// joins a third server; a host removed on one server is refused by the
// other at its next handshake, and its link there is closed.
func TestCluster_TrustIsTheClusters(t *testing.T) {
	s1 := testServer(t, ServerOptions{Name: "s1", RaftTuning: testTuning, Secrets: testSecrets})
	s2, secrets := joinTestServer(t, s1, "s2")
	if *secrets != testSecrets() {
		t.Fatalf("the joining server received %+v, want the cluster's secrets", *secrets)
	}

	// A token made on s1 (the leader) joins a host through s2.
	tok, err := s1.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s2.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()})
	if err != nil {
		t.Fatalf("join through s2 with s1's token: %v", err)
	}
	runHost(t, h)
	waitReady(t, s2, "gpu-a")
	waitReady(t, s1, "gpu-a") // the host links to every server
	// ...and never again, on either server.
	for _, s := range []*Server{s1, s2} {
		_, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: "gpu-b", Local: newFakeLocal()})
		if !structs.HasCode(err, structs.CodeJoinTokenUsed) {
			t.Fatalf("the used token on %s: %v, want join_token_used", s.cl.name, err)
		}
	}
	// A server join token made on the follower joins a third server.
	s3, _ := joinTestServer(t, s2, "s3")
	poll.Until(t, 10*time.Second, "s3 lists gpu-a", func() bool { _, ok := s3.State.Host("gpu-a"); return ok })

	// Removed on the leader: refused by s2 at the handshake, its link
	// there closed.
	// Retried while the three servers elect (their test tuning is quick
	// to call an election on a loaded machine).
	poll.Until(t, 20*time.Second, "the removal committed", func() bool {
		err := s1.Remove("gpu-a")
		if err != nil && !structs.HasCode(err, structs.CodeNotLeader) {
			t.Fatal(err)
		}
		return err == nil
	})
	poll.Until(t, 10*time.Second, "s2 closes the removed host's link", func() bool { return hostState(s2, "gpu-a") == "" })
	// The renewal below may try every server: s3 too must have applied
	// the removal (on a loaded machine it lagged, and signed).
	poll.Until(t, 10*time.Second, "s3 applied the removal", func() bool { _, ok := s3.State.Host("gpu-a"); return !ok })
	// The refusal is the handshake's (the certificate revoked), not only
	// the server's answer to a non-member.
	if err := h.RenewNow(context.Background()); err == nil || !strings.Contains(err.Error(), "bad certificate") {
		t.Fatalf("the removed host's renewal through s2 and s3: %v, want refused at the handshake", err)
	}
	list, err := s2.Servers(context.Background())
	if err != nil || list.Expect != 3 || list.Voters != 3 || list.Self != "s2" {
		t.Fatalf("s2's view of the cluster: %+v (%v)", list, err)
	}

}
