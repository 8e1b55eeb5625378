// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto/tls"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// serverPeer issues a server peer certificate of f's CA named name.
func (f *fixture) serverPeer(t *testing.T, name string) *Credentials {
	t.Helper()
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := f.ca.IssueServerPeer(ServerPeerRequest{Name: name, Public: key.Public(), Now: f.clk.Now()})
	if err != nil {
		t.Fatalf("IssueServerPeer(%s): %v", name, err)
	}
	return NewCredentials(key, iss)
}

func TestCA_IssueServerPeer(t *testing.T) {
	f := newFixture(t, nil)
	cert := f.serverPeer(t, "server-a").Current().Leaf
	if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Errorf("usages %v, want ServerAuth and ClientAuth", cert.ExtKeyUsage)
	}
	if cert.Subject.CommonName != "server-a" || !slices.Equal(cert.DNSNames, []string{"server-a"}) || cert.IsCA {
		t.Errorf("CN %q, DNS %v, CA %v", cert.Subject.CommonName, cert.DNSNames, cert.IsCA)
	}
	if err := cert.CheckSignatureFrom(f.ca.Certificate()); err != nil {
		t.Errorf("not signed by the CA: %v", err)
	}
	if _, err := f.ca.IssueServerPeer(ServerPeerRequest{Name: "Not A Name", Public: cert.PublicKey}); !structs.HasCode(err, structs.CodeInvalidRequest) {
		t.Errorf("a bad name: %v, want invalid_request", err)
	}
}

func TestServerPeerTLS_Handshake(t *testing.T) {
	f := newFixture(t, nil)
	other := newFixture(t, nil)
	a, b := f.serverPeer(t, "server-a"), f.serverPeer(t, "server-b")
	hostCreds, _ := f.enroll(t, "gpu-a")
	stranger := other.serverPeer(t, "server-c")
	peerTLS := func(fx *fixture, c *Credentials) (*tls.Config, *tls.Config) {
		return ServerPeerTLS(fx.ca.Certificate(), c, fx.clk.Now)
	}
	aListen, _ := peerTLS(f, a)
	_, bDial := peerTLS(f, b)
	_, hostDial := peerTLS(f, hostCreds)
	_, strangerDial := peerTLS(other, stranger)
	strangerListen, _ := peerTLS(other, stranger)
	cases := []struct {
		name           string
		server, client *tls.Config
		wantOK         bool
	}{
		{"two servers of the cluster", aListen, bDial, true},
		{"a host's certificate dials a server", aListen, hostDial, false},
		{"a server of another CA dials", aListen, strangerDial, false},
		{"a server dials one of another CA", strangerListen, bDial, false},
		{"the host listener's own config refuses a server peer", f.auth.ServerTLS(), f.hostTLS(a), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			serverErr, clientErr := handshake(t, c.server, c.client)
			t.Logf("server: %v; client: %v", serverErr, clientErr)
			if ok := serverErr == nil && clientErr == nil; ok != c.wantOK {
				t.Fatalf("server %v, client %v; want ok=%v", serverErr, clientErr, c.wantOK)
			}
		})
	}
}

func TestServerPeerTLS_Expired(t *testing.T) {
	f := newFixture(t, nil)
	a, b := f.serverPeer(t, "server-a"), f.serverPeer(t, "server-b")
	f.clk.Add(DefaultServerPeerLifetime + time.Hour)
	listen, _ := ServerPeerTLS(f.ca.Certificate(), a, f.clk.Now)
	_, dial := ServerPeerTLS(f.ca.Certificate(), b, f.clk.Now)
	if serverErr, clientErr := handshake(t, listen, dial); serverErr == nil && clientErr == nil {
		t.Fatal("expired server peer certificates were accepted")
	}
}
