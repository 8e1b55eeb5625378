// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import "time"

// Host states, as GET /hosts reports them (server role; a standalone role
// reports itself "ready").
const (
	// HostReady: the host's link is up and it takes new placements.
	HostReady = "ready"
	// HostDraining: the link is up; the host takes no new placement and
	// its running instances stay.
	HostDraining = "draining"
	// HostLost: the link is down; its instances read uncertain and keep
	// their charges until it comes back with its journal.
	HostLost = "lost"
)

// HostDetail is the server's record of one joined host (GET
// /hosts/{name}): Host plus the link's figures.
type HostDetail struct {
	APIVersion string `json:"api_version"`
	Host
	// Instances are the instances the host reported in its last journal.
	Instances []HostInstance `json:"instances"`
}

// HostInstance is one instance as its host last reported it.
type HostInstance struct {
	Deployment string           `json:"deployment"`
	InstanceID string           `json:"instance_id"`
	State      string           `json:"state"`
	Since      time.Time        `json:"since"`
	Charges    map[string]int64 `json:"charges,omitempty"`
}

// JoinTokenRequest is POST /join-tokens: a one-time token a host joins
// with. TTL is a Go duration ("15m"; empty: the server's default, 1h).
// HostName, when set, binds the token to that host name.
type JoinTokenRequest struct {
	TTL      string `json:"ttl,omitempty"`
	HostName string `json:"host_name,omitempty"`
	// Role is "host" (the default) or "server": a server join token joins
	// another server to the cluster (capyctl start server --join).
	Role string `json:"role,omitempty"`
}

// JoinToken answers POST /join-tokens. Token is shown once: the server
// keeps only its digest.
type JoinToken struct {
	APIVersion string    `json:"api_version"`
	Token      string    `json:"token"`
	ExpiresAt  time.Time `json:"expires_at"`
	// CAFingerprint is the SHA-256 of the server CA's certificate (hex),
	// the same one the token carries.
	CAFingerprint string `json:"ca_fingerprint"`
	HostName      string `json:"host_name,omitempty"`
	// ClusterAddress is the address hosts dial (the server's
	// cluster_listen).
	ClusterAddress string `json:"cluster_address"`
	// Role is "server" for a server join token (empty: a host's).
	Role string `json:"role,omitempty"`
}

// HostAction is POST /hosts/{name}/actions: "drain" (no new placements;
// running instances stay) or "resume".
type HostAction struct {
	Action string `json:"action"`
}
