// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package pki owns the trust between a server and the GPU hosts that join
// it: the server's certificate authority, one-time join tokens, host
// certificates (enrolment with a token, renewal over mutual TLS), revocation
// and the tls.Configs both sides dial and listen with.
//
// The shape, in the manner of kubeadm's and Nomad's bootstrap:
//
//   - The server keeps its own CA (LoadOrCreateCA) in a directory only its
//     owner can read. Its fingerprint is the SHA-256 of the CA certificate's
//     DER.
//   - Authority.NewJoinToken makes a one-time token "capyjoin1.<fingerprint
//     hex>.<secret>". The server keeps only the SHA-256 of the secret, its
//     expiry and the host name it was issued for (a Store the caller gives).
//   - A host reads the fingerprint from the token and pins the CA with it
//     (HostJoinTLS) before it sends anything: a server whose CA does not
//     match is refused with join_ca_mismatch, so the secret never reaches it.
//   - The host sends a CSR for its host name with the token; the server
//     redeems the token (atomically, once) and signs a short-lived host
//     certificate (24 h by default) bound to that name.
//   - The host renews over mutual TLS with its current certificate (RenewAt
//     says when: at two thirds of the lifetime); the name cannot change.
//   - Servers of one cluster talk to each other (raft, core/fleet/raftlog)
//     with server peer certificates (CA.IssueServerPeer: ServerAuth and
//     ClientAuth, no other certificate has both) and ServerPeerTLS, which
//     checks the other end's on both sides. The host listener refuses one.
//   - Authority.Revoke(name) takes effect on the next handshake: ServerTLS's
//     VerifyConnection checks every handshake against the revocation set. A
//     connection already open stays open; the caller closes it.
//
// IMPORTANT: nothing here reads the network or the store of the role:
// core/fleet serves enrolment and renewal on the server's cluster listener
// and keeps the tokens and revocations in <state_dir>/pki/tokens.json
// (FileStore).
package pki
