// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package raftlog replicates the server's state machine (core/fleet's
// State) over several servers with hashicorp/raft: a Node implements
// fleet.Log, so State.Apply commits each Command through raft and every
// server applies it in the same order.
//
// The server role opens a Node through OpenFleet when it runs in a
// cluster (bootstrap_expect above 1, or server_join): raft's traffic then
// comes through the cluster listener's ALPN capyctl-raft/1, already
// through its mutual TLS handshake (Options.Handshaken). Joining,
// forwarding and the operator commands are core/fleet's (servers.go,
// forward.go).
//
// The shape:
//
//   - Nothing home made: consensus, elections, the log and snapshots are
//     hashicorp/raft's; the log and raft's own state (term, vote) live in
//     <dir>/raft.db (bbolt, through raft-boltdb/v2), snapshots in
//     <dir>/snapshots (raft's FileSnapshotStore, checksummed).
//   - The state machine is fleet.State: a committed entry goes to
//     ApplyEncoded (the command and its state change in one transaction of
//     the role's own store); a snapshot is State.Snapshot (hosts and
//     placements, JSON) and a restore State.Restore (the state replaced in
//     one transaction). On a restart raft restores the latest snapshot and
//     replays the log after it; the commands are absolute (set a host's
//     record, delete a placement), so replaying what the store already
//     holds ends in the same state.
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
//     so a later change can forward the mutation. A leader that loses its
//     leadership while committing also answers not_leader, with
//     committed=unknown: the entry may still commit, and a retry is safe
//     because the commands are absolute.
//   - Stats is this server's view (raft state, term, indexes, leader,
//     configuration) for a later `capyctl list servers`.
//
// Not handled yet: a store failure on one server while it applies a
// committed entry leaves that server's state without the entry (logged at
// error); it should stop serving and restore from a snapshot. Server peer
// certificates are not renewed and a removed server's is not revoked.
package raftlog
