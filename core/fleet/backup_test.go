// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// testServerWithCA runs a fleet server whose pki directory starts with
// from's CA (ca.crt, ca.key), as an operator copies it to a new cluster.
func testServerWithCA(t *testing.T, from *Server) *Server {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pki.CACertFile, pki.CAKeyFile} {
		data, err := os.ReadFile(filepath.Join(from.o.StateDir, "pki", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "pki", f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return startTestServer(t, ServerOptions{StateDir: dir, Listen: "127.0.0.1:0", Store: st})
}

func TestServer_StateSnapshotRestore(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	src := testServer(t, ServerOptions{Name: "old"})
	for _, c := range []fsm.Command{
		fsm.HostJoined{Host: "gpu-a"},
		fsm.HostJoined{Host: "gpu-b"},
		fsm.Placed{Placement: &Placement{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}, {Host: "gpu-b", Instances: 1}},
			Routes: []string{"chat-model"}, Revision: 2, At: at}},
	} {
		if err := src.apply(c); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := src.StateSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if snap.Hosts != 2 || snap.Placements != 1 || snap.CAFingerprint != src.CAFingerprint() || !snap.Raft || snap.Server != "old" || snap.Index == 0 {
		t.Fatalf("snapshot header: %+v", snap)
	}
	// The file is indented by the CLI: the checksum survives it.
	file, _ := json.MarshalIndent(snap, "", "  ")
	if _, err := wire.DecodeStateSnapshot(file); err != nil {
		t.Fatalf("an indented snapshot: %v", err)
	}

	// Refusals that change nothing.
	tampered := snap
	tampered.State = bytes.Replace(snap.State, []byte(`"gpu-b"`), []byte(`"gpu-x"`), -1)
	wrongVersion := snap
	wrongVersion.Version = 99
	noHost := snap
	noHost.State = json.RawMessage(`{"hosts":[],"placements":[{"deployment":"chat","hosts":[{"host":"gpu-a","instances":1}]}]}`)
	if err := noHost.Seal(); err != nil {
		t.Fatal(err)
	}
	other := testServer(t, ServerOptions{})
	same := testServerWithCA(t, src)
	if same.CAFingerprint() != src.CAFingerprint() {
		t.Fatal("a copied pki directory did not keep the CA")
	}
	cases := []struct {
		name string
		dst  *Server
		req  wire.StateRestoreRequest
		code structs.Code
	}{
		{"a changed byte", same, wire.StateRestoreRequest{Snapshot: tampered}, structs.CodeSnapshotInvalid},
		{"an unknown format version", same, wire.StateRestoreRequest{Snapshot: wrongVersion}, structs.CodeSnapshotInvalid},
		{"a placement on a host it does not list", same, wire.StateRestoreRequest{Snapshot: noHost, Force: true}, structs.CodeSnapshotInvalid},
		{"another CA", other, wire.StateRestoreRequest{Snapshot: snap}, structs.CodeSnapshotCAMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := c.dst.RestoreState(c.req); !structs.HasCode(err, c.code) {
				t.Fatalf("restore: %v, want %s", err, c.code)
			}
			if len(c.dst.State.Hosts())+len(c.dst.State.Placements()) != 0 {
				t.Fatal("a refused restore changed the state")
			}
		})
	}
	if _, err := wire.DecodeStateSnapshot(file[:len(file)/2]); !structs.HasCode(err, structs.CodeSnapshotInvalid) {
		t.Fatalf("a file cut short: %v", err)
	}

	// Same CA, fresh state: restored; the routes answer.
	out, err := same.RestoreState(wire.StateRestoreRequest{Snapshot: snap})
	if err != nil {
		t.Fatal(err)
	}
	if out.Hosts != 2 || out.Placements != 1 || out.Replaced != 0 {
		t.Fatalf("restored: %+v", out)
	}
	if p, ok := same.State.RouteOwner("chat-model"); !ok || p.Deployment != "chat" || len(p.Hosts) != 2 {
		t.Fatalf("route after restore: %+v %v", p, ok)
	}
	// Again over a state that has hosts: conflict without force, then
	// replaced with it.
	if _, err := same.RestoreState(wire.StateRestoreRequest{Snapshot: snap}); !structs.HasCode(err, structs.CodeConflict) {
		t.Fatalf("a restore over a state: %v, want conflict", err)
	}
	if out, err := other.RestoreState(wire.StateRestoreRequest{Snapshot: snap, Force: true}); err != nil || out.Placements != 1 {
		t.Fatalf("forced restore of another CA: %+v %v", out, err)
	}
}

// TestUntilLeader_NextAddressWhenOneIsOutOfReach: a joining server given
// several addresses goes on to the next when one is out of reach, and to
// the leader a follower names.
func TestUntilLeader_NextAddressWhenOneIsOutOfReach(t *testing.T) {
	var tried []string
	err := untilLeader(context.Background(), joinAddrs("dead:1, follower:2"), hclog.NewNullLogger(), func(_ context.Context, addr string) error {
		tried = append(tried, addr)
		switch addr {
		case "dead:1":
			return structs.Errf(structs.CodeUnavailable, "server %s: connection refused", addr)
		case "follower:2":
			return structs.Errf(structs.CodeNotLeader, "not the leader").WithDetail("leader_address", "leader:3")
		}
		return nil
	})
	if err != nil || strings.Join(tried, " ") != "dead:1 follower:2 leader:3" {
		t.Fatalf("tried %v: %v", tried, err)
	}
}

// TestCluster_RenewsItsPeerCertificate: a server re-signs its own peer
// certificate with the cluster's CA once two thirds of its life passed (or
// after it expired), saves it, and serves it from then on.
func TestCluster_RenewsItsPeerCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, err := pki.LoadOrCreateCA(dir, func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.IssueServerPeer(pki.ServerPeerRequest{Name: "s1", Public: key.Public(), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.SaveServerPeer(dir, key, iss); err != nil {
		t.Fatal(err)
	}
	cl := &cluster{name: "s1", ca: ca, creds: pki.NewCredentials(key, iss), pkiDir: dir}
	if renewed, err := cl.renewPeer(t0.Add(30 * 24 * time.Hour)); err != nil || renewed {
		t.Fatalf("a third into its life: renewed %v (%v)", renewed, err)
	}
	later := t0.Add(70 * 24 * time.Hour)
	if renewed, err := cl.renewPeer(later); err != nil || !renewed {
		t.Fatalf("past two thirds: renewed %v (%v)", renewed, err)
	}
	cur := cl.creds.Current().Leaf
	if !cur.NotAfter.After(iss.Certificate.NotAfter) {
		t.Fatalf("the renewed certificate expires %s", cur.NotAfter)
	}
	saved, err := pki.LoadServerPeer(dir, ca)
	if err != nil || !saved.Current().Leaf.Equal(cur) {
		t.Fatalf("the saved certificate is not the renewed one: %v", err)
	}
}
