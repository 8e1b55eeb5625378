// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// NewKey makes a host's (or the server's) private key: ECDSA P-256.
func NewKey() (crypto.Signer, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make a key: %w", err)
	}
	return k, nil
}

// NewCSR returns the DER of a certificate request for hostName, signed by
// key.
func NewCSR(key crypto.Signer, hostName string) ([]byte, error) {
	if err := checkHostName(hostName); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: hostName},
		DNSNames: []string{hostName},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("make the certificate request: %w", err)
	}
	return der, nil
}

// RenewAt returns when a certificate should be renewed: two thirds into its
// lifetime, which leaves a third (8 h of the default 24 h) for retries.
func RenewAt(cert *x509.Certificate) time.Time {
	life := cert.NotAfter.Sub(cert.NotBefore)
	return cert.NotBefore.Add(life * 2 / 3)
}

// PinCA parses the CA certificate a server sent and checks it against the
// fingerprint of the join token; a mismatch is join_ca_mismatch.
func PinCA(der []byte, fingerprint [32]byte) (*x509.Certificate, error) {
	if sha256.Sum256(der) != fingerprint {
		return nil, structs.Errf(structs.CodeJoinCAMismatch, "the server's CA certificate does not have the join token's fingerprint")
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, structs.Wrap(structs.CodeJoinCAMismatch, err, "parse the server's CA certificate")
	}
	if !ca.IsCA {
		return nil, structs.Errf(structs.CodeJoinCAMismatch, "the pinned certificate is not a CA")
	}
	return ca, nil
}

// HostJoinTLS returns the config a host joins with: no client certificate
// yet, and the server trusted only if its chain holds the CA with the join
// token's fingerprint and that CA signed the server certificate for the
// name the host dials. A server that fails is join_ca_mismatch and sees no
// token.
//
// IMPORTANT: InsecureSkipVerify only turns off the system roots; the pinned
// verification in VerifyConnection replaces them and must stay.
func HostJoinTLS(fingerprint [32]byte) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) < 2 {
				return structs.Errf(structs.CodeJoinCAMismatch, "the server sent no CA certificate to pin")
			}
			var ca *x509.Certificate
			for _, c := range cs.PeerCertificates[1:] {
				if pinned, err := PinCA(c.Raw, fingerprint); err == nil {
					ca = pinned
					break
				}
			}
			if ca == nil {
				return structs.Errf(structs.CodeJoinCAMismatch, "the server's CA is not the one the join token names")
			}
			return verifyServer(cs, ca)
		},
	}
}

// PinnedCA returns the CA a join connection pinned (after a handshake with
// HostJoinTLS succeeded).
func PinnedCA(cs tls.ConnectionState, fingerprint [32]byte) (*x509.Certificate, error) {
	for _, c := range cs.PeerCertificates {
		if sha256.Sum256(c.Raw) == fingerprint {
			return PinCA(c.Raw, fingerprint)
		}
	}
	return nil, structs.Errf(structs.CodeJoinCAMismatch, "the server's CA is not the one the join token names")
}

func verifyServer(cs tls.ConnectionState, ca *x509.Certificate) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:     roots,
		DNSName:   cs.ServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return structs.Wrap(structs.CodeJoinCAMismatch, err, "the server's certificate")
	}
	return nil
}

// Credentials hold a host's current certificate; a renewal swaps it and
// the next handshake uses the new one.
type Credentials struct {
	cur atomic.Pointer[tls.Certificate]
}

// NewCredentials returns Credentials holding the certificate issued for
// key.
func NewCredentials(key crypto.Signer, issued *Issued) *Credentials {
	c := &Credentials{}
	c.Set(key, issued)
	return c
}

// Set replaces the current certificate.
func (c *Credentials) Set(key crypto.Signer, issued *Issued) {
	c.cur.Store(&tls.Certificate{Certificate: [][]byte{issued.Certificate.Raw}, PrivateKey: key, Leaf: issued.Certificate})
}

// Current returns the current certificate (nil before Set).
func (c *Credentials) Current() *tls.Certificate {
	if c == nil {
		return nil
	}
	return c.cur.Load()
}

// HostTLS returns the config a host dials the server with: TLS 1.3, the
// server verified against the pinned CA only, and the host's current
// certificate as its client certificate (none while creds is nil or empty:
// the server then refuses the handshake).
func HostTLS(pinnedCA *x509.Certificate, creds *Credentials) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(pinnedCA)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := creds.Current(); c != nil {
				return c, nil
			}
			// No certificate: send none and let the server refuse.
			return &tls.Certificate{}, nil
		},
	}
}
