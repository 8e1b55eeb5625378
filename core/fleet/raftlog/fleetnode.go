// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"github.com/capyctl/capyctl/core/fleet"
)

var _ fleet.RaftNode = (*Node)(nil)

// OpenFleet opens a node for the server role (fleet.ServerOptions.OpenRaft):
// raft's traffic comes through the cluster listener's raft ALPN, already
// through its mutual TLS handshake, and the node dials the others with
// c.DialTLS (which offers that ALPN).
func OpenFleet(c fleet.RaftConfig) (fleet.RaftNode, error) {
	o := Options{ID: c.ID, Dir: c.Dir, Listener: c.Listener, Advertise: c.Advertise, DialTLS: c.DialTLS, Handshaken: true,
		State: c.State, Logger: c.Logger}
	if c.Bootstrap {
		o.Bootstrap = []Peer{{ID: c.ID, Address: c.Advertise}}
	}
	return Open(o)
}

// Status is Stats as the server role reads it (fleet.RaftNode).
func (n *Node) Status() fleet.RaftStatus {
	st := n.Stats()
	out := fleet.RaftStatus{ID: st.ID, State: st.State, Term: st.Term, LastIndex: st.LastIndex, CommitIndex: st.CommitIndex,
		AppliedIndex: st.AppliedIndex, LeaderID: st.LeaderID, LeaderAddress: st.LeaderAddress}
	for _, s := range st.Servers {
		out.Servers = append(out.Servers, fleet.RaftMember{ID: s.ID, Address: s.Address, Voter: s.Voter})
	}
	return out
}
