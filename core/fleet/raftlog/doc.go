// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package raftlog replicates the server's state machine (core/fleet/fsm's
// State) over the servers of a cluster with hashicorp/raft: a Node
// implements fsm.Log, so State.Apply commits each command through raft and
// every server applies it in the same order.
//
// Every server role opens a Node (a server alone is a cluster of one
// voter, which elects itself at once: Node.electAlone): raft's traffic
// comes through the cluster listener's ALPN capyctl-raft/1, already
// through its mutual TLS handshake (Options.Handshaken). Joining,
// forwarding and the operator commands are core/fleet's (servers.go,
// forward.go). The node publishes what the server waits on as signals,
// never polled: its leadership (raft's NotifyCh: Leadership) and any
// change of its view (raft's observations, a configuration entry applied:
// Changed).
//
// The shape:
//
//   - Nothing home made: consensus, elections, the log and snapshots are
//     hashicorp/raft's; the log and raft's own state (term, vote) live in
//     <dir>/raft.db (bbolt, through raft-boltdb/v2), snapshots in
//     <dir>/snapshots (raft's FileSnapshotStore, checksummed).
//   - The state machine is fsm.State: a committed entry goes to
//     ApplyEntry (the command, its state change and the entry's index in
//     one transaction of the role's own store); a snapshot is
//     State.Snapshot and a restore State.Restore (the state replaced in one
//     transaction, with the snapshot's index). On a restart raft restores
//     the latest snapshot and replays the log after it; an entry at or
//     below the state's recorded index is skipped.
//   - A state that halted (a command this server cannot read, a store that
//     refused a write) blocks raft's apply until the node closes: raft
//     never moves past an entry this server did not apply.
//   - Servers talk over mutual TLS 1.3 (tlsStream, a raft.StreamLayer used
//     with raft.NewNetworkTransport): each server holds a server peer
//     certificate of the cluster's CA (pki.CA.IssueServerPeer: ServerAuth
//     and ClientAuth), and both ends verify the other against the CA
//     (pki.ServerPeerTLS). A host's certificate, or one from another CA,
//     ends the handshake.
//   - Bootstrap: the servers of the first set are each given the same list
//     of IDs and addresses (Options.Bootstrap) and bootstrap it (raft's own
//     way: identical configurations are safe); a single server lists only
//     itself. Any later server starts with no list and the leader adds it
//     (Node.AddVoter); it catches up from the log or from a snapshot.
//     Chosen over discovery by --bootstrap-expect N with --join addresses,
//     which needs an exchange of IDs before raft runs: a later change can
//     build that list and hand it here.
//   - Propose on the leader hands the command to raft and waits until it
//     is committed and applied here; its error is the state machine's (a
//     refusal is the same on every server). On a follower it returns
//     not_leader with the leader's raft ID and server-to-server address in
//     the details (leader_id, leader_address; empty during an election),
//     so the caller sends the command there (core/fleet's apply). A leader
//     that loses its leadership while committing also answers not_leader,
//     with committed=unknown: the entry may still commit.
//   - Timing: a heartbeat timeout and an election timeout of 600 ms
//     (raft's are 1 s), raft's 500 ms leader lease; the reason is at
//     defaultHeartbeatTimeout. Tuning overrides them (tests).
//   - Stats is this server's view (raft state, term, indexes, leader,
//     configuration) for `capyctl list servers`.
package raftlog
