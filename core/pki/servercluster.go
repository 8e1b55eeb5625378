// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// TokenRoleServer marks a join token that joins a server to the cluster
// (TokenRecord.Role): it is redeemed by RedeemServerToken, never by a
// host's Enroll.
const TokenRoleServer = "server"

// The files of a server's own peer certificate, beside the CA's (0600).
const (
	ServerPeerCertFile = "server-peer.crt"
	ServerPeerKeyFile  = "server-peer.key"
)

// NewServerJoinToken returns a one-time token that joins a server to the
// cluster, valid for ttl.
func (a *Authority) NewServerJoinToken(ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", structs.Errf(structs.CodeInvalidRequest, "a join token's time to live must be positive, not %s", ttl)
	}
	t, err := newJoinToken(a.ca.Fingerprint())
	if err != nil {
		return "", err
	}
	if err := a.store.PutToken(TokenRecord{Hash: t.secretHash(), Expires: a.now().Add(ttl), Role: TokenRoleServer}); err != nil {
		return "", fmt.Errorf("record the join token: %w", err)
	}
	return t.String(), nil
}

// RedeemServerToken redeems a server join token: join_token_invalid for a
// malformed or unknown one or a host's, join_token_used, join_token_expired.
func (a *Authority) RedeemServerToken(token string) error {
	t, err := ParseJoinToken(token)
	if err != nil {
		return err
	}
	if t.Fingerprint != a.ca.Fingerprint() {
		return structs.Errf(structs.CodeJoinTokenInvalid, "the join token names another cluster's CA")
	}
	now := a.now()
	rec, found, err := a.store.RedeemToken(t.secretHash(), TokenRoleServer, now)
	switch {
	case err != nil:
		return fmt.Errorf("redeem the join token: %w", err)
	case !found:
		return structs.Errf(structs.CodeJoinTokenInvalid, "the leader never issued the join token (server join tokens live on the server that made them: create one on the leader)")
	case rec.Role != TokenRoleServer: // not redeemed: the host it was made for can still join with it
		return structs.Errf(structs.CodeJoinTokenInvalid, "the join token joins a host, not a server (capyctl create join-token --role server)")
	case !rec.Used.IsZero():
		return structs.Errf(structs.CodeJoinTokenUsed, "the join token was redeemed at %s; create a new one", rec.Used.UTC().Format(time.RFC3339))
	case !now.Before(rec.Expires):
		return structs.Errf(structs.CodeJoinTokenExpired, "the join token expired at %s; create a new one", rec.Expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// EncodePEM returns the CA's certificate and key as PEM, for a server
// joining the cluster: every server signs host certificates.
// IMPORTANT: the key goes only to a server that redeemed a server join
// token, over the join's TLS connection pinned to this CA.
func (c *CA) EncodePEM() (certPEM, keyPEM []byte, err error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode the CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// InstallCA writes a CA received from the cluster into dir (0700; both
// files 0600, never replacing one) and loads it.
func InstallCA(dir string, certPEM, keyPEM []byte) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the CA directory: %w", err)
	}
	if err := ownerOnly(dir, true); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if err := writeNew(keyPath, keyPEM); err != nil {
		return nil, err
	}
	if err := writeNew(certPath, certPEM); err != nil {
		return nil, err
	}
	return loadCA(certPath, keyPath)
}

// HasCA reports whether dir holds a CA certificate.
func HasCA(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, CACertFile))
	return err == nil
}

// SaveServerPeer writes a server's peer certificate and key into dir
// (0600 each, replacing older ones).
func SaveServerPeer(dir string, key crypto.Signer, issued *Issued) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode the server peer key: %w", err)
	}
	for name, data := range map[string][]byte{
		ServerPeerKeyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		ServerPeerCertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: issued.Certificate.Raw}),
	} {
		path := filepath.Join(dir, name)
		tmp := path + ".tmp"
		_ = os.Remove(tmp)
		if err := writeNew(tmp, data); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// LoadServerPeer reads a server's peer certificate and key from dir;
// fs.ErrNotExist when it holds none.
func LoadServerPeer(dir string, ca *CA) (*Credentials, error) {
	certPath, keyPath := filepath.Join(dir, ServerPeerCertFile), filepath.Join(dir, ServerPeerKeyFile)
	if _, err := os.Stat(certPath); errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, p := range []string{certPath, keyPath} {
		if err := ownerOnly(p, false); err != nil {
			return nil, err
		}
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, structs.Errf(structs.CodeInvalidConfig, "the server peer files in %s are not PEM", dir)
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
		return nil, structs.Errf(structs.CodeInvalidConfig, "the server peer key in %s does not match its certificate", dir)
	}
	return NewCredentials(key, &Issued{Certificate: cert, CA: ca.cert.Raw}), nil
}
