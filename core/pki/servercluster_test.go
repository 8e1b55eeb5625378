// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// TestAuthority_ServerJoinTokens: a server join token is redeemed once by
// RedeemServerToken and never by a host's Enroll; a host's token never
// joins a server.
func TestAuthority_ServerJoinTokens(t *testing.T) {
	f := newFixture(t, nil)
	server := func() string {
		tok, err := f.auth.NewServerJoinToken(time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	host := func() string {
		tok, err := f.auth.NewJoinToken(time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	used := server()
	if err := f.auth.RedeemServerToken(used); err != nil {
		t.Fatalf("first redemption: %v", err)
	}
	expired := server()
	f.clk.Add(2 * time.Hour)
	cases := []struct {
		name   string
		redeem func() error
		want   structs.Code
	}{
		{"server token twice", func() error { return f.auth.RedeemServerToken(used) }, structs.CodeJoinTokenUsed},
		{"server token expired", func() error { return f.auth.RedeemServerToken(expired) }, structs.CodeJoinTokenExpired},
		{"host token joins no server", func() error { return f.auth.RedeemServerToken(host()) }, structs.CodeJoinTokenInvalid},
		{"server token enrols no host", func() error {
			_, csr := newCSR(t, "gpu-a")
			_, err := f.auth.Enroll(EnrollRequest{Token: server(), CSR: csr})
			return err
		}, structs.CodeJoinTokenInvalid},
		{"garbage", func() error { return f.auth.RedeemServerToken("capyjoin1.zz.zz") }, structs.CodeJoinTokenInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.redeem()
			if got := structs.AsError(err).Code; err == nil || got != c.want {
				t.Fatalf("got %v (%s), want %s", err, got, c.want)
			}
		})
	}
}

// TestInstallCA: the CA a joining server receives is written owner-only
// and loads as the same CA; the server peer credentials survive a reload.
func TestInstallCA(t *testing.T) {
	f := newFixture(t, nil)
	certPEM, keyPEM, err := f.ca.EncodePEM()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pki")
	ca, err := InstallCA(dir, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Fingerprint() != f.ca.Fingerprint() {
		t.Fatal("the installed CA is another")
	}
	for _, name := range []string{CACertFile, CAKeyFile} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", name, st.Mode(), err)
		}
	}
	if _, err := InstallCA(dir, certPEM, keyPEM); err == nil {
		t.Fatal("InstallCA replaced a CA")
	}
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.IssueServerPeer(ServerPeerRequest{Name: "s2", Public: key.Public()})
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveServerPeer(dir, key, iss); err != nil {
		t.Fatal(err)
	}
	creds, err := LoadServerPeer(dir, ca)
	if err != nil {
		t.Fatal(err)
	}
	if got := creds.Current().Leaf.Subject.CommonName; got != "s2" {
		t.Fatalf("reloaded peer certificate names %q", got)
	}
}
