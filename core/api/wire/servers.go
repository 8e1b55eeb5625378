// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

// ServerList answers GET /servers: the server cluster as the answering
// server sees it, each member's figures asked of the member itself.
type ServerList struct {
	APIVersion string `json:"api_version"`
	// Raft is false for a server alone (no bootstrap_expect above 1, no
	// server_join): it lists itself only.
	Raft bool `json:"raft"`
	// Self is the answering server's name.
	Self string `json:"self"`
	// Leader is the leader's name ("" during an election).
	Leader string `json:"leader"`
	// Expect is bootstrap_expect; Voters the voters of the current
	// configuration. Degraded is true while Voters < Expect or a voter is
	// unreachable.
	Expect   int          `json:"expect"`
	Voters   int          `json:"voters"`
	Degraded bool         `json:"degraded"`
	Servers  []ServerInfo `json:"servers"`
}

// ServerInfo is one member of the server cluster.
type ServerInfo struct {
	Name string `json:"name"`
	// Address is its cluster address (raft's traffic goes there too).
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
	// State is leader, follower, candidate, shutdown, or unreachable when
	// the answering server could not ask it.
	State     string `json:"state"`
	Term      uint64 `json:"term,omitempty"`
	LastIndex uint64 `json:"last_index,omitempty"`
	// AppliedIndex is the last entry its state machine applied.
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	// Leader is the leader as this member sees it.
	Leader string `json:"leader,omitempty"`
	Error  string `json:"error,omitempty"`
}
