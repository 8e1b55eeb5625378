// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// The cluster's trust is replicated (core/fleet/fsm's trust records): a
// join token made on any server is redeemed on any, once; a removed host
// is refused by every server at its next handshake; a removed server's
// name is refused on every server-to-server connection until it joins
// again. The CA is every server's (a joining server receives it), and so
// are the API key and the admin token (ClusterSecrets).

// ClusterSecrets are the credentials every server of a cluster shares: a
// client's API key and an operator's admin token work on any server. A
// joining server receives them with the CA.
//
// IMPORTANT: meant to grow (named API keys): add fields, never change the
// meaning of one.
type ClusterSecrets struct {
	APIKey     string `json:"api_key"`
	AdminToken string `json:"admin_token"`
}

// replicatedTokens is pki's token store over the replicated state: every
// call commits a command (through the leader, from a follower).
type replicatedTokens struct{ s *Server }

var _ pki.Store = replicatedTokens{}

// PutToken records a new join token (its digest) for the whole cluster.
func (r replicatedTokens) PutToken(rec pki.TokenRecord) error {
	return r.s.apply(fsm.TokenCreated{Token: rec})
}

// RedeemToken redeems a token in the log's order: of two redemptions of
// one token on two servers, exactly one finds it unused.
func (r replicatedTokens) RedeemToken(hash, role string, _ time.Time) (pki.TokenRecord, bool, error) {
	var red fsm.Redemption
	if err := r.s.applyValue(fsm.TokenRedeemed{Hash: hash, Role: role}, &red); err != nil {
		return pki.TokenRecord{}, false, err
	}
	return red.Token, red.Found, nil
}

// PutRevocation is never called: a host's revocation is part of its
// removal (fsm.HostRemoved).
func (r replicatedTokens) PutRevocation(string, time.Time) error {
	return structs.Errf(structs.CodeInternal, "a host is revoked by its removal from the cluster")
}

// Revocations is never called (pki.AuthorityOptions.Revoked reads the
// state).
func (r replicatedTokens) Revocations() (map[string]time.Time, error) { return nil, nil }

// serverRefused refuses the server-to-server connections of a removed
// server.
func (s *Server) serverRefused(name string) error {
	if at, revoked := s.State.ServerRevoked(name); revoked {
		return structs.Errf(structs.CodeServerRemoved, "server %s was removed from the cluster at %s", name, at.Format(time.RFC3339))
	}
	return nil
}

// hostRefusal is why a host that is not a member is refused: removed
// (revoked, for good) or not known here (yet: a cluster restored from a
// snapshot after the host first reached it, a join not applied yet),
// which the host retries.
func (s *Server) hostRefusal(name string) *structs.Error {
	if at, revoked := s.State.HostRevoked(name); revoked {
		return structs.Errf(structs.CodeHostRevoked, "host %q was removed from the cluster at %s; join it again with a new token", name, at.Format(time.RFC3339))
	}
	e := structs.Errf(structs.CodeHostUnknown, "host %q is not a member of this cluster (yet): a restored snapshot may bring it back; it tries again", name)
	e.RetryAfter = 2
	return e
}

// fileRevocations reads the revocations a server kept in its own file
// before they were replicated (<state_dir>/pki/tokens.json), for the state
// it carries into the log.
func fileRevocations(pkiDir string) map[string]time.Time {
	data, err := os.ReadFile(filepath.Join(pkiDir, "tokens.json"))
	if err != nil {
		return nil
	}
	var f struct {
		Revoked map[string]time.Time `json:"revoked"`
	}
	if json.Unmarshal(data, &f) != nil {
		return nil
	}
	return f.Revoked
}
