// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// tokenPrefix starts every join token and names its format's version.
const tokenPrefix = "capyjoin1"

// JoinToken is a parsed join token: the fingerprint of the CA the host must
// pin, and the secret the server redeems.
type JoinToken struct {
	Fingerprint [32]byte
	Secret      []byte
}

// String returns the token as an operator copies it:
// capyjoin1.<fingerprint hex>.<secret base64url>.
func (t JoinToken) String() string {
	return tokenPrefix + "." + hex.EncodeToString(t.Fingerprint[:]) + "." + base64.RawURLEncoding.EncodeToString(t.Secret)
}

// secretHash is what the server keeps of a token: the SHA-256 of its
// secret, hex. The secret itself is never stored.
func (t JoinToken) secretHash() string {
	h := sha256.Sum256(t.Secret)
	return hex.EncodeToString(h[:])
}

// ParseJoinToken parses a token string; a malformed one is join_token_invalid.
func ParseJoinToken(s string) (JoinToken, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 3 || parts[0] != tokenPrefix {
		return JoinToken{}, structs.Errf(structs.CodeJoinTokenInvalid, "the join token does not parse (want %s.<fingerprint>.<secret>)", tokenPrefix)
	}
	fp, err := hex.DecodeString(parts[1])
	if err != nil || len(fp) != sha256.Size {
		return JoinToken{}, structs.Errf(structs.CodeJoinTokenInvalid, "the join token's CA fingerprint does not parse")
	}
	secret, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(secret) < 16 {
		return JoinToken{}, structs.Errf(structs.CodeJoinTokenInvalid, "the join token's secret does not parse")
	}
	var t JoinToken
	copy(t.Fingerprint[:], fp)
	t.Secret = secret
	return t, nil
}

// newJoinToken makes a token with a fresh 32-byte secret.
func newJoinToken(fp [32]byte) (JoinToken, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return JoinToken{}, fmt.Errorf("make a join token: %w", err)
	}
	return JoinToken{Fingerprint: fp, Secret: secret}, nil
}

// TokenRecord is what the server keeps of a join token.
type TokenRecord struct {
	// Hash is the SHA-256 of the token's secret, hex: the record's key.
	Hash string `json:"hash"`
	// HostName is the host the token was issued for; "" lets any name join.
	HostName string    `json:"host_name,omitempty"`
	Expires  time.Time `json:"expires"`
	// Used is when the token was redeemed; zero while it was not.
	Used time.Time `json:"used,omitzero"`
	// Role is TokenRoleServer for a token that joins a server to the
	// cluster ("" : a host's).
	Role string `json:"role,omitempty"`
}

// Store keeps the server's join tokens and revocations. The caller
// implements it over its own store; MemStore and FileStore are given.
type Store interface {
	// PutToken records a new token.
	PutToken(rec TokenRecord) error
	// RedeemToken marks the token with this hash used at now, when its
	// Role is role ("" a host's), and returns the record as it stood
	// before; found is false for an unknown hash. A token of another role
	// is returned as it is, not redeemed: a host that shows a server's
	// token (or a server a host's) does not burn it.
	// IMPORTANT: atomic: of two calls for one hash, exactly one sees a zero
	// Used. That is what makes a token one-time.
	RedeemToken(hash, role string, now time.Time) (rec TokenRecord, found bool, err error)
	// PutRevocation records that the host's certificates issued at or
	// before at are revoked.
	PutRevocation(hostName string, at time.Time) error
	// Revocations returns every revocation.
	Revocations() (map[string]time.Time, error)
}

// tokenKeep is how long a token's record is kept past its expiry, so that a
// late reuse reads join_token_used or join_token_expired rather than
// join_token_invalid.
const tokenKeep = 7 * 24 * time.Hour

// MemStore is a Store in memory, for tests and standalone experiments.
type MemStore struct {
	mu      sync.Mutex
	tokens  map[string]TokenRecord
	revoked map[string]time.Time
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{tokens: map[string]TokenRecord{}, revoked: map[string]time.Time{}}
}

// PutToken implements Store.
func (m *MemStore) PutToken(rec TokenRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	pruneTokens(m.tokens, rec.Expires.Add(-tokenKeep))
	m.tokens[rec.Hash] = rec
	return nil
}

// RedeemToken implements Store.
func (m *MemStore) RedeemToken(hash, role string, now time.Time) (TokenRecord, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.tokens[hash]
	if !ok {
		return TokenRecord{}, false, nil
	}
	if rec.Used.IsZero() && rec.Role == role {
		used := rec
		used.Used = now
		m.tokens[hash] = used
	}
	return rec, true, nil
}

// PutRevocation implements Store.
func (m *MemStore) PutRevocation(hostName string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.revoked[hostName] = at
	return nil
}

// Revocations implements Store.
func (m *MemStore) Revocations() (map[string]time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]time.Time, len(m.revoked))
	for k, v := range m.revoked {
		out[k] = v
	}
	return out, nil
}

// pruneTokens drops records that expired before cutoff.
func pruneTokens(tokens map[string]TokenRecord, cutoff time.Time) {
	for h, r := range tokens {
		if r.Expires.Before(cutoff) {
			delete(tokens, h)
		}
	}
}

// FileStore is a Store in one JSON file (0600), rewritten whole under a
// lock on each change (write, sync, rename). It suits tests and a server
// with a handful of hosts; the server role will keep these records in its
// store instead.
type FileStore struct {
	mu   sync.Mutex
	path string
}

// fileState is FileStore's file.
type fileState struct {
	Tokens  map[string]TokenRecord `json:"tokens"`
	Revoked map[string]time.Time   `json:"revoked"`
}

// NewFileStore returns a FileStore over path; the file is made on the first
// write, in a directory that must exist and be owner-only.
func NewFileStore(path string) (*FileStore, error) {
	if err := ownerOnly(filepath.Dir(path), true); err != nil {
		return nil, err
	}
	return &FileStore{path: path}, nil
}

func (f *FileStore) load() (fileState, error) {
	st := fileState{Tokens: map[string]TokenRecord{}, Revoked: map[string]time.Time{}}
	data, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read %s: %w", f.path, err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("parse %s: %w", f.path, err)
	}
	if st.Tokens == nil {
		st.Tokens = map[string]TokenRecord{}
	}
	if st.Revoked == nil {
		st.Revoked = map[string]time.Time{}
	}
	return st, nil
}

func (f *FileStore) save(st fileState) error {
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode %s: %w", f.path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", f.path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	return nil
}

// PutToken implements Store.
func (f *FileStore) PutToken(rec TokenRecord) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.load()
	if err != nil {
		return err
	}
	pruneTokens(st.Tokens, rec.Expires.Add(-tokenKeep))
	st.Tokens[rec.Hash] = rec
	return f.save(st)
}

// RedeemToken implements Store. The lock and the write before the answer
// make it atomic within one process; IMPORTANT: two processes must not
// share one file.
func (f *FileStore) RedeemToken(hash, role string, now time.Time) (TokenRecord, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.load()
	if err != nil {
		return TokenRecord{}, false, err
	}
	rec, ok := st.Tokens[hash]
	if !ok {
		return TokenRecord{}, false, nil
	}
	if rec.Used.IsZero() && rec.Role == role {
		used := rec
		used.Used = now
		st.Tokens[hash] = used
		if err := f.save(st); err != nil {
			return TokenRecord{}, false, err
		}
	}
	return rec, true, nil
}

// PutRevocation implements Store.
func (f *FileStore) PutRevocation(hostName string, at time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.load()
	if err != nil {
		return err
	}
	st.Revoked[hostName] = at
	return f.save(st)
}

// Revocations implements Store.
func (f *FileStore) Revocations() (map[string]time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.load()
	if err != nil {
		return nil, err
	}
	return st.Revoked, nil
}
