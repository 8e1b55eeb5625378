// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// The files of a CA directory. IMPORTANT: both are written 0600 in a 0700
// directory and a load refuses looser modes.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// caLifetime is the CA certificate's validity. A server CA outlives many
// host certificates; rotating it is a later issue's.
const caLifetime = 10 * 365 * 24 * time.Hour

// CA is the server's certificate authority: its certificate and key.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// Certificate returns the CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Fingerprint returns the SHA-256 of the CA certificate's DER, the value a
// join token carries and a host pins.
func (c *CA) Fingerprint() [32]byte { return sha256.Sum256(c.cert.Raw) }

// FingerprintHex returns Fingerprint in lowercase hex.
func (c *CA) FingerprintHex() string {
	fp := c.Fingerprint()
	return hex.EncodeToString(fp[:])
}

// LoadOrCreateCA loads the CA kept in dir, or creates it there on the first
// call. dir is made 0700 when missing; an existing dir, or CA files, that
// anyone but the owner can read are refused (invalid_config) rather than
// used or repaired. now is the clock (nil: time.Now).
func LoadOrCreateCA(dir string, now func() time.Time) (*CA, error) {
	if now == nil {
		now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the CA directory: %w", err)
	}
	if err := ownerOnly(dir, true); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		return loadCA(certPath, keyPath)
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		return createCA(certPath, keyPath, now())
	case certErr == nil || keyErr == nil:
		// IMPORTANT: never make a new key beside a half CA: hosts trust the
		// old one, and an operator must decide.
		return nil, structs.Errf(structs.CodeInvalidConfig,
			"the CA directory %s holds only one of %s and %s; restore the other or remove both to make a new CA (every host must join again)",
			dir, CACertFile, CAKeyFile)
	default:
		return nil, fmt.Errorf("read the CA directory: %w", errors.Join(certErr, keyErr))
	}
}

// ownerOnly refuses a path whose mode lets the group or others in.
func ownerOnly(path string, wantDir bool) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.IsDir() != wantDir {
		return structs.Errf(structs.CodeInvalidConfig, "%s: not a %s", path, map[bool]string{true: "directory", false: "file"}[wantDir])
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		want := "600"
		if wantDir {
			want = "700"
		}
		return structs.Errf(structs.CodeInvalidConfig,
			"%s has mode %04o: keys, certificates and join tokens must be readable by their owner only (chmod %s %s)", path, perm, want, path)
	}
	return nil
}

// OwnerOnly refuses a key file (or, with dir, its directory) whose mode
// lets the group or others in: invalid_config naming the chmod that fixes
// it. A missing path is an error that wraps fs.ErrNotExist.
func OwnerOnly(path string, dir bool) error { return ownerOnly(path, dir) }

func createCA(certPath, keyPath string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make the CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "CapyCTL server CA", Organization: []string{"CapyCTL"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sign the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse the CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode the CA key: %w", err)
	}
	// The key first: a crash between the two leaves a key alone, which the
	// next start refuses instead of overwriting.
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return nil, err
	}
	if err := writeNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key}, nil
}

// writeNew writes a new file 0600, synced, refusing to replace one.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return f.Close()
}

func loadCA(certPath, keyPath string) (*CA, error) {
	for _, p := range []string{certPath, keyPath} {
		if err := ownerOnly(p, false); err != nil {
			return nil, err
		}
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read the CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read the CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, structs.Errf(structs.CodeInvalidConfig, "the CA files %s and %s are not PEM certificate and key", certPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "parse %s", certPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "parse %s", keyPath)
	}
	key, ok := k.(crypto.Signer)
	if !ok || !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, structs.Errf(structs.CodeInvalidConfig, "the CA key %s does not match the certificate %s", keyPath, certPath)
	}
	if !cert.IsCA {
		return nil, structs.Errf(structs.CodeInvalidConfig, "%s is not a CA certificate", certPath)
	}
	return &CA{cert: cert, key: key}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

// newSerial returns a random 128-bit serial number.
func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("make a serial number: %w", err)
	}
	return s, nil
}

// leafOptions are the fields of a certificate the CA signs.
type leafOptions struct {
	commonName string
	dnsNames   []string
	ips        []net.IP
	usage      x509.ExtKeyUsage
	// moreUsages follow usage (a server peer's ClientAuth).
	moreUsages []x509.ExtKeyUsage
	notBefore  time.Time
	notAfter   time.Time
	pub        crypto.PublicKey
}

// sign signs a leaf certificate and returns its DER.
func (c *CA) sign(o leafOptions) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: o.commonName},
		DNSNames:              o.dnsNames,
		IPAddresses:           o.ips,
		NotBefore:             o.notBefore,
		NotAfter:              o.notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           append([]x509.ExtKeyUsage{o.usage}, o.moreUsages...),
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, o.pub, c.key)
	if err != nil {
		return nil, fmt.Errorf("sign a certificate for %q: %w", o.commonName, err)
	}
	return x509.ParseCertificate(der)
}
