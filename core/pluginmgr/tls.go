// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/store"
)

// Mutual TLS between the core and its drivers.
//
// go-plugin's AutoMTLS has two halves. The plugin half (in every driver,
// unchanged): a driver started with PLUGIN_CLIENT_CERT makes a certificate
// of its own, prints it on the handshake line and serves gRPC only to a
// client that presents the certificate it was given. The client half
// (ClientConfig.AutoMTLS) makes that client certificate and keeps its key in
// the client's memory only.
//
// IMPORTANT: the client half cannot survive a core restart. In go-plugin
// v1.8.0 the key never leaves the Client, ReattachConfig has no TLS fields,
// and a re-attaching Client uses ClientConfig.TLSConfig as given. A core
// restarted after kill -9 could therefore never speak to a driver launched
// with AutoMTLS again. So the core plays the client half itself: it makes
// the certificate (exactly as go-plugin does), passes it to the driver in
// PLUGIN_CLIENT_CERT, sets ClientConfig.TLSConfig (go-plugin then pins the
// driver's certificate from the handshake line into RootCAs), records the
// driver's certificate as the TLS handshake presents it, and stores key and
// both certificates in the reattach record (capyctl.db, mode 0600 in the
// 0700 state directory). A re-attach builds the same TLSConfig from the
// record. On the wire this is AutoMTLS; only where the client key lives
// differs.

// envClientCert is go-plugin's variable carrying the client certificate to
// the plugin (read by goplugin.Serve; not exported by go-plugin).
const envClientCert = "PLUGIN_CLIENT_CERT"

// tlsServerName is the name go-plugin's AutoMTLS certificates carry.
const tlsServerName = "localhost"

// clientTLS is the core's side of one driver connection.
type clientTLS struct {
	certPEM, keyPEM []byte
	config          *tls.Config

	mu         sync.Mutex
	serverCert []byte // DER, once a handshake has verified it
}

// newClientTLS makes a fresh client certificate for a driver launch.
func newClientTLS() (*clientTLS, error) {
	certPEM, keyPEM, err := generateCert()
	if err != nil {
		return nil, fmt.Errorf("make the driver client certificate: %w", err)
	}
	c := &clientTLS{certPEM: certPEM, keyPEM: keyPEM}
	if err := c.build(nil); err != nil {
		return nil, err
	}
	return c, nil
}

// clientTLSFrom rebuilds the TLS config of a recorded driver connection.
func clientTLSFrom(r *store.DriverTLS) (*clientTLS, error) {
	if r == nil || len(r.ClientCertPEM) == 0 || len(r.ClientKeyPEM) == 0 || len(r.ServerCertDER) == 0 {
		return nil, fmt.Errorf("the reattach record has no TLS material")
	}
	c := &clientTLS{certPEM: r.ClientCertPEM, keyPEM: r.ClientKeyPEM, serverCert: r.ServerCertDER}
	server, err := x509.ParseCertificate(r.ServerCertDER)
	if err != nil {
		return nil, fmt.Errorf("recorded driver certificate: %w", err)
	}
	if err := c.build(server); err != nil {
		return nil, err
	}
	return c, nil
}

// build makes the tls.Config: the client certificate, TLS 1.2 or later, the
// driver's certificate as the only root (go-plugin fills RootCAs from the
// handshake line on a launch; a re-attach passes the recorded one), and a
// hook that records the certificate a verified handshake presented.
func (c *clientTLS) build(server *x509.Certificate) error {
	cert, err := tls.X509KeyPair(c.certPEM, c.keyPEM)
	if err != nil {
		return fmt.Errorf("driver client certificate: %w", err)
	}
	c.config = &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		ServerName:   tlsServerName,
		// VerifyConnection runs after the chain was verified against
		// RootCAs, so what it records is the pinned driver certificate.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 {
				c.mu.Lock()
				c.serverCert = cs.PeerCertificates[0].Raw
				c.mu.Unlock()
			}
			return nil
		},
	}
	if server != nil {
		pool := x509.NewCertPool()
		pool.AddCert(server)
		c.config.RootCAs = pool
	}
	return nil
}

// record returns the material to store, or nil before a handshake.
func (c *clientTLS) record() *store.DriverTLS {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.serverCert == nil {
		return nil
	}
	return &store.DriverTLS{ClientCertPEM: c.certPEM, ClientKeyPEM: c.keyPEM, ServerCertDER: c.serverCert}
}

// generateCert makes a self-signed certificate and key in PEM, shaped as
// go-plugin's AutoMTLS certificates are (mtls.go: CA, localhost, client and
// server use), so a driver built with any go-plugin version accepts it.
func generateCert() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: tlsServerName, Organization: []string{"CapyCTL"}},
		DNSNames:              []string{tlsServerName},
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageKeyAgreement | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SerialNumber:          sn,
		NotBefore:             time.Now().Add(-30 * time.Second),
		NotAfter:              time.Now().Add(262980 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	var cb, kb bytes.Buffer
	_ = pem.Encode(&cb, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	_ = pem.Encode(&kb, &pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return cb.Bytes(), kb.Bytes(), nil
}
