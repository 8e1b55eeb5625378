// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// TestState_HostsByName: Hosts lists the hosts by name, whatever the order
// they joined in (a map's order would change from one call to the next).
func TestState_HostsByName(t *testing.T) {
	s, _ := openTestState(t)
	for _, h := range []string{"gpu-c", "gpu-a", "gpu-d", "gpu-b"} {
		if _, _, err := s.Apply(HostJoined{Host: h}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, h := range s.Hosts() {
		got = append(got, h.Name)
	}
	if want := "[gpu-a gpu-b gpu-c gpu-d]"; fmt.Sprint(got) != want {
		t.Fatalf("hosts %v, want %s", got, want)
	}
}

// TestDecodeSnapshot_Revocations: a snapshot's revocations are of hosts
// and of servers; one of another kind, or without a name, makes the
// snapshot invalid.
func TestDecodeSnapshot_Revocations(t *testing.T) {
	cases := []struct {
		kind, name string
		ok         bool
	}{
		{"host", "gpu-a", true},
		{"server", "s2", true},
		{"client", "c", false},
		{"host", "", false},
	}
	for _, c := range cases {
		data, err := json.Marshal(snapshotData{Revocations: []revocation{{Kind: c.kind, Name: c.name}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = decodeSnapshot(data)
		if (err == nil) != c.ok || (err != nil && structs.CodeOf(err) != structs.CodeSnapshotInvalid) {
			t.Fatalf("a revocation of %s %q: %v, want valid %v", c.kind, c.name, err, c.ok)
		}
	}
}

// TestPlacement_Managed: the hosts run a placement from the desired state
// when it has a spec and is no group; an adopted one (no spec) they do
// not.
func TestPlacement_Managed(t *testing.T) {
	if (&Placement{}).Managed() {
		t.Fatal("an adopted placement (no spec) is managed")
	}
	if !(&Placement{Spec: json.RawMessage(`{"name":"a"}`)}).Managed() {
		t.Fatal("a placement with a spec is not managed")
	}
}

// TestState_RestoreWritesEveryRecord: a restore (raft's) writes every
// record of the snapshot to the store (every placement, every engine, the
// revocations of hosts and of servers, each of its kind, every token and
// every API key), so that a server reopened from its store holds the same
// state.
func TestState_RestoreWritesEveryRecord(t *testing.T) {
	src, _ := openTestState(t)
	for _, c := range []Command{
		HostJoined{Host: "gpu-a"}, HostJoined{Host: "gpu-old"}, HostRemoved{Host: "gpu-old"}, ServerRemoved{Name: "s3"},
		Placed{Placement: &Placement{Deployment: "chat", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}, Routes: []string{"chat"}, At: at}},
		Placed{Placement: &Placement{Deployment: "code", Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}, Routes: []string{"code"}, At: at}},
		EngineRegistered{Engine: EngineRecord{Name: "vllm", Request: json.RawMessage(`{"path":"/opt/vllm"}`)}},
		TokenCreated{Token: pki.TokenRecord{Hash: "h1", Expires: time.Now().Add(time.Hour)}},
		TokenCreated{Token: pki.TokenRecord{Hash: "h2", Expires: time.Now().Add(time.Hour)}},
		KeyCreated{Key: structs.APIKey{Name: "default", Role: true}, Seed: true},
		KeyCreated{Key: structs.APIKey{Name: "bob", ID: "0123456789ab", Digest: "sha256:00"}},
	} {
		if _, _, err := src.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.CommandType(), err)
		}
	}
	snap, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dst, st := openTestState(t)
	if _, _, err := dst.Apply(KeyCreated{Key: structs.APIKey{Name: "default", Role: true}, Seed: true}); err != nil {
		t.Fatal(err)
	}
	version := dst.KeysVersion()
	if err := dst.Restore(snap); err != nil {
		t.Fatal(err)
	}
	// The keepers of the keys reload: the version counts the restore.
	if v := dst.KeysVersion(); v <= version {
		t.Fatalf("keys version %d after the restore, was %d", v, version)
	}
	again, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*State{dst, again} {
		if got := len(s.Placements()); got != 2 {
			t.Fatalf("%d placements, want 2", got)
		}
		if _, ok := s.Engine("vllm"); !ok {
			t.Fatal("the engine is missing")
		}
		if _, ok := s.HostRevoked("gpu-old"); !ok {
			t.Fatal("the host's revocation is missing")
		}
		if _, ok := s.ServerRevoked("s3"); !ok {
			t.Fatal("the server's revocation is missing")
		}
		if _, ok := s.HostRevoked("s3"); ok {
			t.Fatal("the server's revocation reads as a host's")
		}
		for _, h := range []string{"h1", "h2"} {
			if _, ok := s.Token(h); !ok {
				t.Fatalf("the token %s is missing", h)
			}
		}
		if keys := s.APIKeys(); len(keys) != 2 || !s.KeysSeeded() {
			t.Fatalf("keys %+v (seeded %v), want default and bob", keys, s.KeysSeeded())
		}
	}
}
