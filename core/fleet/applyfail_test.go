// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// immutable makes path refuse every write, through descriptors already
// open too (chattr +i: what a store on a full or failing disk meets, and
// the faults suite's read-only store); the test is skipped where that
// needs a privilege it lacks. undo takes the flag off again.
func immutable(t *testing.T, path string) (undo func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chattr +i needs root")
	}
	if out, err := exec.Command("chattr", "+i", path).CombinedOutput(); err != nil {
		t.Skipf("chattr +i: %v: %s", err, strings.TrimSpace(string(out)))
	}
	done := false
	undo = func() {
		if !done {
			done = true
			if out, err := exec.Command("chattr", "-i", path).CombinedOutput(); err != nil {
				t.Errorf("chattr -i: %v: %s", err, out)
			}
		}
	}
	t.Cleanup(undo)
	return undo
}

// TestCluster_AStoreThatRefusesAnApplyStopsTheServer pins what the
// fleet-trust review's M6 asked for: a server whose store refuses the
// write of a committed entry (a full disk, an immutable or failing file)
// must not go on serving a state that lacks it. It halts there (raft's
// applied index does not move past the entry), reports store_unavailable
// as its reason to stop (the role exits 27), keeps its state as it was
// (no half-applied change in memory), while the other servers go on; once
// the store takes writes again its restart applies the entry from the
// log and it is the others' equal.
func TestCluster_AStoreThatRefusesAnApplyStopsTheServer(t *testing.T) {
	s1 := testServer(t, ServerOptions{Name: "s1", RaftTuning: steadyTuning, Secrets: testSecrets})
	var tok wire.JoinToken
	onLeader(t, "a server join token", func() (err error) {
		tok, err = s1.NewServerJoinToken(time.Minute)
		return err
	})
	dir := t.TempDir()
	db := filepath.Join(dir, "capyctl.db")
	st, err := store.Open(db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o2 := ServerOptions{StateDir: dir, Listen: "127.0.0.1:0", Store: st, Name: "s2", Join: s1.Advertise(), JoinToken: tok.Token,
		RaftTuning: steadyTuning, Secrets: testSecrets, AdoptSecrets: func(ClusterSecrets) error { return nil }}
	s2 := startTestServer(t, o2)
	s3 := joinSteady(t, s1, "s3")
	poll.Until(t, 10*time.Second, "three voters, s2 applied what s1 did", func() bool {
		return len(s1.cl.node.Stats().Servers) == 3 && s2.State.Applied() >= s1.State.Applied()
	})

	undo := immutable(t, db)
	onLeader(t, "the leader's change with one store refusing", func() error { return s1.apply(fsm.HostJoined{Host: "gpu-x"}) })
	var reason error
	select {
	case reason = <-s2.Fatal():
	case <-time.After(20 * time.Second):
		t.Fatal("the server whose store refused the entry did not stop")
	}
	if !structs.HasCode(reason, structs.CodeStoreUnavailable) || structs.AsError(reason).Info().Exit != 27 {
		t.Fatalf("the server stops with %v, want store_unavailable (exit 27)", reason)
	}
	if _, ok := s2.State.Host("gpu-x"); ok {
		t.Fatal("the halted server's state shows the change its store refused")
	}
	poll.Until(t, 10*time.Second, "s3 applied the change", func() bool { _, ok := s3.State.Host("gpu-x"); return ok })
	// The cluster goes on without it.
	onLeader(t, "a change once the server halted", func() error { return s1.apply(fsm.HostJoined{Host: "gpu-y"}) })

	poll.Until(t, 10*time.Second, "s3 applied the next change", func() bool { _, ok := s3.State.Host("gpu-y"); return ok })
	// The operator frees the store and starts the server again, on the
	// same state directory and address.
	addr := s2.Addr()
	s2.Close()
	st.Close()
	undo()
	st, err = store.Open(db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o2.Store, o2.Listen, o2.Join, o2.JoinToken = st, addr, "", ""
	again, err := NewServer(o2)
	if err != nil {
		t.Fatalf("restart once the store takes writes: %v", err)
	}
	again.Start()
	t.Cleanup(func() { again.Close(); st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := again.JoinCluster(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the restarted server applied the entry its store refused, and the next", func() bool {
		_, x := again.State.Host("gpu-x")
		_, y := again.State.Host("gpu-y")
		return x && y && again.State.HaltErr() == nil
	})
}
