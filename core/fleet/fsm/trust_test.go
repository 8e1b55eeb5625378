// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// redeem commits a redemption and returns its value.
func redeem(t *testing.T, s *State, hash string) Redemption {
	t.Helper()
	v, _, err := s.Apply(TokenRedeemed{Hash: hash})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := v.(Redemption)
	return r
}

func TestState_TokensAreRedeemedOnce(t *testing.T) {
	s, st := openTestState(t)
	rec := pki.TokenRecord{Hash: "h1", HostName: "gpu-a", Expires: time.Now().Add(time.Hour)}
	if _, _, err := s.Apply(TokenCreated{Token: rec}); err != nil {
		t.Fatal(err)
	}
	first := redeem(t, s, "h1")
	if !first.Found || !first.Token.Used.IsZero() || first.Token.HostName != "gpu-a" {
		t.Fatalf("the first redemption: %+v", first)
	}
	second := redeem(t, s, "h1")
	if !second.Found || second.Token.Used.IsZero() {
		t.Fatalf("the second redemption saw an unused token: %+v", second)
	}
	if r := redeem(t, s, "nope"); r.Found {
		t.Fatalf("an unknown token was found: %+v", r)
	}
	again, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := again.Token("h1"); !ok || r.Used.IsZero() {
		t.Fatalf("the used token after a reopen: %+v %v", r, ok)
	}
	// A token long expired goes with the next one made; one expired
	// within tokenKeep, or not expired, stays (a late reuse reads
	// join_token_expired).
	old := pki.TokenRecord{Hash: "h0", Expires: time.Now().Add(-30 * 24 * time.Hour)}
	recent := pki.TokenRecord{Hash: "h-1d", Expires: time.Now().Add(-24 * time.Hour)}
	for _, c := range []Command{TokenCreated{Token: old}, TokenCreated{Token: recent}, TokenCreated{Token: pki.TokenRecord{Hash: "h2", Expires: time.Now().Add(time.Hour)}}} {
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.Token("h0"); ok {
		t.Fatal("a token expired a month ago was kept")
	}
	for _, h := range []string{"h-1d", "h1"} {
		if _, ok := s.Token(h); !ok {
			t.Fatalf("the token %s, within its keep, was dropped", h)
		}
	}
}

func TestState_RemovalsRevoke(t *testing.T) {
	s, _ := openTestState(t)
	for _, c := range []Command{HostJoined{Host: "gpu-a"}, HostRemoved{Host: "gpu-a"}, ServerRemoved{Name: "s3"}} {
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if at, ok := s.HostRevoked("gpu-a"); !ok || at.IsZero() || at.Nanosecond() != 0 {
		t.Fatalf("the removed host's revocation: %v %v (whole seconds)", at, ok)
	}
	if _, ok := s.ServerRevoked("s3"); !ok {
		t.Fatal("the removed server is not refused")
	}
	if _, _, err := s.Apply(ServerAdmitted{Name: "s3"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.ServerRevoked("s3"); ok {
		t.Fatal("a server admitted again is still refused")
	}
	if _, _, err := s.Apply(HostRemoved{Host: "gpu-z"}); structs.CodeOf(err) != structs.CodeNotFound {
		t.Fatalf("removal of an unknown host: %v", err)
	}
}

func TestState_EnginesAndTrustInSnapshots(t *testing.T) {
	s, _ := openTestState(t)
	for _, c := range []Command{
		EngineRegistered{Engine: EngineRecord{Name: "vllm", Request: json.RawMessage(`{"path":"/opt/vllm"}`)}},
		HostJoined{Host: "gpu-a"}, HostRemoved{Host: "gpu-a"},
		TokenCreated{Token: pki.TokenRecord{Hash: "h1", Expires: time.Now().Add(time.Hour)}},
	} {
		if _, _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Apply(EngineRegistered{Engine: EngineRecord{Name: "vllm", Request: json.RawMessage(`{}`)}}); structs.CodeOf(err) != structs.CodeEngineExists {
		t.Fatalf("a second registration of a name: %v", err)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := openTestState(t)
	if err := dst.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if _, ok := dst.Engine("vllm"); !ok {
		t.Error("the restored state lacks the engine")
	}
	if _, ok := dst.HostRevoked("gpu-a"); !ok {
		t.Error("the restored state forgot a revocation")
	}
	if _, ok := dst.Token("h1"); !ok {
		t.Error("raft's restore forgot a token")
	}
	// An operator's restore replaces the records but keeps the cluster's
	// own tokens.
	other, _ := openTestState(t)
	if _, _, err := other.Apply(TokenCreated{Token: pki.TokenRecord{Hash: "mine", Expires: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Apply(Restored{State: snap}); err != nil {
		t.Fatal(err)
	}
	if _, ok := other.Token("mine"); !ok {
		t.Error("an operator's restore dropped the cluster's own token")
	}
	if _, ok := other.Token("h1"); ok {
		t.Error("an operator's restore brought the backup's tokens")
	}
	if _, ok := other.HostRevoked("gpu-a"); !ok {
		t.Error("an operator's restore forgot the backup's revocation")
	}
	if _, _, err := other.Apply(EngineRemoved{Name: "vllm"}); err != nil {
		t.Errorf("remove the restored engine: %v", err)
	}
}
