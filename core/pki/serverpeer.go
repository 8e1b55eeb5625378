// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"slices"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// DefaultServerPeerLifetime is a server peer certificate's validity unless
// the caller says otherwise. Longer than a host's: a server is not revoked
// one by one (it is removed from the raft configuration); each server
// renews its own at two thirds of its life (core/fleet, renewPeer).
const DefaultServerPeerLifetime = 90 * 24 * time.Hour

// ServerPeerRequest is what IssueServerPeer signs.
type ServerPeerRequest struct {
	// Name is the server's name (its raft ID): the common name and the
	// only DNS SAN.
	Name string
	// Public is the server's public key.
	Public crypto.PublicKey
	// Now is the signing time (zero: time.Now).
	Now time.Time
	// Lifetime is the validity (0: DefaultServerPeerLifetime).
	Lifetime time.Duration
}

// IssueServerPeer signs the certificate a server presents to the other
// servers of its cluster (raft's traffic), both when it listens and when
// it dials: ServerAuth and ClientAuth in one certificate. No other
// certificate of this CA carries both (a host's is ClientAuth only, the
// host listener's ServerAuth only), which is what ServerPeerTLS checks.
func (c *CA) IssueServerPeer(r ServerPeerRequest) (*Issued, error) {
	if err := checkHostName(r.Name); err != nil {
		return nil, err
	}
	if r.Public == nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "a server peer certificate needs a public key")
	}
	now := r.Now
	if now.IsZero() {
		now = time.Now()
	}
	life := r.Lifetime
	if life <= 0 {
		life = DefaultServerPeerLifetime
	}
	cert, err := c.sign(leafOptions{
		commonName: r.Name,
		dnsNames:   []string{r.Name},
		usage:      x509.ExtKeyUsageServerAuth,
		moreUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		// Other servers check it with their own clocks.
		notBefore: now.Add(-time.Hour),
		notAfter:  now.Add(life),
		pub:       r.Public,
	})
	if err != nil {
		return nil, err
	}
	return &Issued{Certificate: cert, CA: c.cert.Raw}, nil
}

// ServerPeerTLS returns the configs of server-to-server connections: listen
// (a client certificate required) and dial. Both ends show creds' current
// certificate, and both accept the other only if its certificate chains to
// ca, is valid now (nil now: time.Now) and is a server peer's
// (IssueServerPeer): a host's certificate or one from another CA ends the
// handshake.
//
// The peer's name is not bound to the address dialed: every server of the
// cluster is trusted alike, and raft names its peers by ID, not by the
// certificate.
//
// IMPORTANT: the dial config sets InsecureSkipVerify only to turn off the
// system roots and the host name check; VerifyConnection replaces them and
// must stay. VerifyConnection runs on every handshake, and session tickets
// are off, so each connection shows a certificate.
func ServerPeerTLS(ca *x509.Certificate, creds *Credentials, now func() time.Time) (listen, dial *tls.Config) {
	return ServerPeerTLSRefusing(ca, creds, now, nil)
}

// ServerPeerTLSRefusing is ServerPeerTLS with refused, which names the
// servers whose certificates are refused even though the CA signed them
// (a server removed from the cluster: its name is refused until it joins
// again with a new server join token). refused returns the refusal for a
// server's name, nil for one taken; nil refuses none.
func ServerPeerTLSRefusing(ca *x509.Certificate, creds *Credentials, now func() time.Time, refused func(name string) error) (listen, dial *tls.Config) {
	if now == nil {
		now = time.Now
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	verify := func(cs tls.ConnectionState) error {
		if err := verifyServerPeer(cs, roots, now()); err != nil {
			return err
		}
		if refused != nil {
			return refused(cs.PeerCertificates[0].Subject.CommonName)
		}
		return nil
	}
	current := func() (*tls.Certificate, error) {
		if c := creds.Current(); c != nil {
			return c, nil
		}
		return nil, structs.Errf(structs.CodeUnauthorized, "this server holds no server peer certificate")
	}
	listen = &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
		Time:                   now,
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return current() },
		VerifyConnection:       verify,
	}
	dial = &tls.Config{
		MinVersion:             tls.VersionTLS13,
		InsecureSkipVerify:     true,
		SessionTicketsDisabled: true,
		Time:                   now,
		GetClientCertificate:   func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return current() },
		VerifyConnection:       verify,
	}
	return listen, dial
}

// verifyServerPeer checks the certificate the other server showed.
func verifyServerPeer(cs tls.ConnectionState, roots *x509.CertPool, now time.Time) error {
	if len(cs.PeerCertificates) == 0 {
		return structs.Errf(structs.CodeUnauthorized, "the peer showed no certificate")
	}
	leaf := cs.PeerCertificates[0]
	if !hasUsage(leaf, x509.ExtKeyUsageServerAuth) || !hasUsage(leaf, x509.ExtKeyUsageClientAuth) {
		return structs.Errf(structs.CodeUnauthorized, "the peer's certificate %q is not a server peer's (ServerAuth and ClientAuth)", leaf.Subject.CommonName)
	}
	// No intermediates: the CA signs every certificate itself
	// (MaxPathLenZero).
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return structs.Wrap(structs.CodeUnauthorized, err, "the peer's certificate %q", leaf.Subject.CommonName)
	}
	return nil
}

func hasUsage(cert *x509.Certificate, u x509.ExtKeyUsage) bool {
	return slices.Contains(cert.ExtKeyUsage, u)
}
