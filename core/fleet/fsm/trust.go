// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// The cluster's trust records: join tokens (by their secret's digest),
// revocations of removed hosts and servers. They are replicated, so a
// join token made on any server is redeemed on any, once, and a removed
// host or server is refused by every server.
//
// IMPORTANT: this part of the state is meant to grow (named API keys,
// each server's credentials): add a type and a key prefix, never reuse
// one.

// Key prefixes of the trust records.
const (
	prefixToken         = "token/"
	prefixRevokedHost   = "revoked/host/"
	prefixRevokedServer = "revoked/server/"
)

// tokenKeep is how long a token's record is kept past its expiry, so that
// a late reuse reads join_token_used or join_token_expired rather than
// join_token_invalid (pki's rule).
const tokenKeep = 7 * 24 * time.Hour

// Command types of the trust records.
const (
	TypeTokenCreated   Type = "token_created"
	TypeTokenRedeemed  Type = "token_redeemed"
	TypeServerRemoved  Type = "server_removed"
	TypeServerAdmitted Type = "server_admitted"
)

// TokenCreated records a new join token (its digest, never the token).
type TokenCreated struct {
	Token pki.TokenRecord `json:"token"`
}

// TokenRedeemed marks a token used at the command's time. Its value is
// a Redemption: the record as it stood before, and whether there was one.
// Exactly one redemption of a token finds it unused: the log orders them.
// A token of another Role than the redemption's ("" a host's) is returned
// as it is, not marked used: a host that shows a server's token (or a
// server a host's) does not burn it.
type TokenRedeemed struct {
	Hash string `json:"hash"`
	Role string `json:"role,omitempty"`
}

// Redemption is TokenRedeemed's value.
type Redemption struct {
	Token pki.TokenRecord `json:"token"`
	Found bool            `json:"found"`
}

// ServerRemoved refuses a removed server's name on every server's
// server-to-server connections, until it is admitted again.
type ServerRemoved struct {
	Name string `json:"name"`
}

// ServerAdmitted takes a server's name back (it redeemed a server join
// token: a machine wiped and joined again under its old name).
type ServerAdmitted struct {
	Name string `json:"name"`
}

func (TokenCreated) CommandType() Type   { return TypeTokenCreated }
func (TokenRedeemed) CommandType() Type  { return TypeTokenRedeemed }
func (ServerRemoved) CommandType() Type  { return TypeServerRemoved }
func (ServerAdmitted) CommandType() Type { return TypeServerAdmitted }

// trust is the trust records as memory holds them (State.mu).
type trust struct {
	tokens         map[string]pki.TokenRecord
	revokedHosts   map[string]time.Time
	revokedServers map[string]time.Time
}

// load takes one stored trust record into memory (other keys are
// ignored: a newer release's).
func (t *trust) load(k string, v []byte) error {
	switch {
	case strings.HasPrefix(k, prefixToken):
		var r pki.TokenRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		t.tokens[r.Hash] = r
	case strings.HasPrefix(k, prefixRevokedHost):
		var at time.Time
		if err := json.Unmarshal(v, &at); err != nil {
			return err
		}
		t.revokedHosts[strings.TrimPrefix(k, prefixRevokedHost)] = at
	case strings.HasPrefix(k, prefixRevokedServer):
		var at time.Time
		if err := json.Unmarshal(v, &at); err != nil {
			return err
		}
		t.revokedServers[strings.TrimPrefix(k, prefixRevokedServer)] = at
	}
	return nil
}

func newTrust() trust {
	return trust{tokens: map[string]pki.TokenRecord{}, revokedHosts: map[string]time.Time{}, revokedServers: map[string]time.Time{}}
}

func (s *State) applyTokenCreated(fs *store.FleetState, c TokenCreated, at time.Time) (func(), any, error) {
	if c.Token.Hash == "" {
		return nil, nil, structs.Errf(structs.CodeInvalidRequest, "a join token record names its digest")
	}
	// Tokens long expired go with each new one: the log decides when, so
	// every server forgets the same ones.
	var gone []string
	for h, r := range s.trust.tokens {
		if r.Expires.Before(at.Add(-tokenKeep)) {
			gone = append(gone, h)
			if err := fs.Delete(prefixToken + h); err != nil {
				return nil, nil, err
			}
		}
	}
	rec := c.Token
	return func() {
		for _, h := range gone {
			delete(s.trust.tokens, h)
		}
		s.trust.tokens[rec.Hash] = rec
	}, nil, fs.Put(prefixToken+rec.Hash, rec)
}

func (s *State) applyTokenRedeemed(fs *store.FleetState, c TokenRedeemed, at time.Time) (func(), any, error) {
	rec, ok := s.trust.tokens[c.Hash]
	if !ok {
		return func() {}, Redemption{}, nil
	}
	if !rec.Used.IsZero() || rec.Role != c.Role {
		return func() {}, Redemption{Token: rec, Found: true}, nil
	}
	used := rec
	used.Used = at
	return func() { s.trust.tokens[c.Hash] = used }, Redemption{Token: rec, Found: true}, fs.Put(prefixToken+c.Hash, used)
}

// revokeHost records a host's revocation at at (whole seconds: pki
// compares it with a certificate's NotBefore).
func (s *State) revokeHost(fs *store.FleetState, host string, at time.Time) (func(), error) {
	at = at.UTC().Truncate(time.Second)
	return func() { s.trust.revokedHosts[host] = at }, fs.Put(prefixRevokedHost+host, at)
}

func (s *State) applyServerRemoved(fs *store.FleetState, c ServerRemoved, at time.Time) (func(), any, error) {
	at = at.UTC()
	return func() { s.trust.revokedServers[c.Name] = at }, nil, fs.Put(prefixRevokedServer+c.Name, at)
}

func (s *State) applyServerAdmitted(fs *store.FleetState, c ServerAdmitted) (func(), any, error) {
	return func() { delete(s.trust.revokedServers, c.Name) }, nil, fs.Delete(prefixRevokedServer + c.Name)
}

// Token returns a join token's record by its digest.
func (s *State) Token(hash string) (pki.TokenRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.trust.tokens[hash]
	return r, ok
}

// HostRevoked reports when a host's certificates were revoked (its
// removal), if they were.
func (s *State) HostRevoked(name string) (time.Time, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	at, ok := s.trust.revokedHosts[name]
	return at, ok
}

// ServerRevoked reports whether a server's name is refused (removed and
// not admitted since), and since when.
func (s *State) ServerRevoked(name string) (time.Time, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	at, ok := s.trust.revokedServers[name]
	return at, ok
}

// revocation is one revocation as a snapshot holds it.
type revocation struct {
	Kind string    `json:"kind"` // "host" or "server"
	Name string    `json:"name"`
	At   time.Time `json:"at"`
}

// revocationsLocked lists the revocations, by kind then name.
func (s *State) revocationsLocked() []revocation {
	var out []revocation
	for n, at := range s.trust.revokedHosts {
		out = append(out, revocation{Kind: "host", Name: n, At: at})
	}
	for n, at := range s.trust.revokedServers {
		out = append(out, revocation{Kind: "server", Name: n, At: at})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// tokensLocked lists the token records, by digest.
func (s *State) tokensLocked() []pki.TokenRecord {
	out := make([]pki.TokenRecord, 0, len(s.trust.tokens))
	for _, r := range s.trust.tokens {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Hash < out[j].Hash })
	return out
}
