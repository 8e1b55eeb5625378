// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"context"
	"crypto/tls"
)

// What the server's tests (core/fleet) reach of a host beyond its API:
// they drive a real host against a real server.

// PKIDir is where a host keeps its key, certificate and pinned CA.
func PKIDir(stateDir string) string { return hostPKIDir(stateDir) }

// RenewNow renews the host's certificate once, now.
func (h *Host) RenewNow(ctx context.Context) error { return h.renew(ctx) }

// TLSFor is the host's mutual TLS config for one conversation with the
// server at addr.
func (h *Host) TLSFor(addr, alpn string) *tls.Config { return h.tlsFor(addr, alpn) }

// Certificate is the host's current certificate.
func (h *Host) Certificate() *tls.Certificate { return h.creds.Current() }

// Rename makes the host name itself name in its Hello from now on (its
// certificate keeps the name it was issued for).
func (h *Host) Rename(name string) { h.o.Name = name }
