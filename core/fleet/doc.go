// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package fleet runs CapyCTL on several machines: a server that routes and
// places, and GPU hosts that join it over mutual TLS and run the engines.
//
// The shape:
//
//   - One cluster listener on the server (cluster_listen), TLS 1.3 only.
//     The ALPN a host offers picks the conversation: capyctl-join/1
//     (enrolment with a join token over HTTP/1.1; no client certificate
//     yet), and, with the host's certificate verified against the server's
//     CA and its revocation checked on every handshake, h2 (the host link's
//     gRPC Connect stream, core/hostlink/proto/hostv1), capyctl-relay/1
//     (the relay) and http/1.1 (certificate renewal).
//   - Hosts dial; the server never does. The relay is a TLS connection the
//     host opened on which the host serves HTTP/2 and the server is the
//     client (as Nomad's servers reach their clients through the
//     connection each client opened): inference requests and the
//     management calls a host answers travel on it, one HTTP/2 stream
//     each, so a host behind NAT serves, a hang-up at the server resets
//     the stream and the host's router cancels the engine's work.
//   - A host is a standalone role (the same lifecycle, ledger, drivers and
//     router) without a public endpoint: the server places a deployment on
//     a host and the host's own ledger admits it, parks, wakes and switches
//     within the host.
//   - Every change to the cluster's state (hosts joined, drained,
//     removed; deployments placed and unplaced) is a typed, versioned
//     command of core/fleet/fsm, committed through raft (core/fleet/raftlog)
//     and applied by every server in the log's order. Every server runs
//     raft: a server alone is a cluster of one voter (servers.go). The
//     leader's own work starts and stops with its leadership (leader.go);
//     a follower has the leader commit a change and waits until it
//     applied it (state.go).
package fleet
