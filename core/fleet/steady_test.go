// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// steadyTuning is raft's timing for the cluster tests that must see no
// leader change they did not cause: testTuning's 200 ms heartbeat loses
// its leader now and then on a loaded machine (a load average of 20 on
// two cores).
var steadyTuning = raftlog.Tuning{HeartbeatTimeout: time.Second, ElectionTimeout: time.Second,
	LeaderLeaseTimeout: 500 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}

// joinSteady starts a server named name that joins via's cluster with
// steadyTuning, and returns it once it is a voter.
func joinSteady(t *testing.T, via *Server, name string) *Server {
	t.Helper()
	var tok wire.JoinToken
	onLeader(t, "a server join token", func() (err error) {
		tok, err = via.NewServerJoinToken(time.Minute)
		return err
	})
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return startTestServer(t, ServerOptions{StateDir: dir, Listen: "127.0.0.1:0", Store: st, Name: name, Join: via.Advertise(), JoinToken: tok.Token,
		RaftTuning: steadyTuning, Secrets: testSecrets, AdoptSecrets: func(ClusterSecrets) error { return nil }})
}

// onLeader runs f until it is not refused not_leader (an election under
// way), within 20 s, and fails the test on another error.
func onLeader(t *testing.T, what string, f func() error) {
	t.Helper()
	var err error
	poll.Until(t, 20*time.Second, what+" with a leader elected", func() bool {
		err = f()
		return !structs.HasCode(err, structs.CodeNotLeader)
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
