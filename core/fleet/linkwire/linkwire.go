// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package linkwire is what the fleet's server (core/fleet) and its host
// agent (core/fleet/hostagent) agree on at the cluster address: the ALPN
// names of its conversations, the join and renewal bodies, the handshake
// bound and heartbeat default, and how a server's error answer reads back
// as a catalogue error. Neither side imports the other; both import this.
package linkwire

import (
	"encoding/json"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// The ALPN protocols of the cluster address (see core/fleet/tlsmux.go).
//
// Join and renewal are HTTP/1.1 (net/http closes a connection whose ALPN
// is another it has no handler for): a joining host offers capyctl-join/1
// to get the join config (no client certificate) and both sides then agree
// on http/1.1; a renewal is http/1.1 with the host's certificate.
const (
	// ALPNJoin asks for enrolment with a join token (no client
	// certificate).
	ALPNJoin = "capyctl-join/1"
	// ALPNLink is the host link's gRPC (HTTP/2).
	ALPNLink = "h2"
	// ALPNRelay is the relay: the host serves HTTP/2, the server asks.
	ALPNRelay = "capyctl-relay/1"
	// ALPNHTTP1 carries a join or a renewal.
	ALPNHTTP1 = "http/1.1"
)

const (
	// DefaultHeartbeat is the link's heartbeat when the server names none.
	DefaultHeartbeat = 2 * time.Second
	// HandshakeTimeout bounds a TLS handshake and a join's or renewal's
	// exchange at the cluster address.
	HandshakeTimeout = 10 * time.Second
)

// JoinRequest is the body of a host's POST /join.
type JoinRequest struct {
	Token    string `json:"token"`
	CSR      []byte `json:"csr"`
	Previous []byte `json:"previous,omitempty"`
}

// JoinAnswer is the answer to a join or a renewal: the host certificate's
// and the CA's DER.
type JoinAnswer struct {
	Certificate []byte `json:"certificate"`
	CA          []byte `json:"ca"`
}

// HostError turns an error answer of host (or "server") back into a
// catalogue error.
func HostError(host string, status int, data []byte) error {
	var env wire.ErrorEnvelope
	if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
		e := structs.Errf(structs.Code(env.Error.Code), "host %s: %s", host, env.Error.Message)
		for k, v := range env.Error.Details {
			e = e.WithDetail(k, v)
		}
		return e.WithDetail("host", host)
	}
	return structs.Errf(structs.CodeInternal, "host %s answered %d", host, status).WithDetail("host", host)
}
