// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package hostlink holds the plumbing of the host link, the one long-lived
// gRPC stream a GPU host opens to its server (proto/hostv1/host.proto
// documents every message): for now the host's side of command
// idempotency, Deduper, which runs each command_id once and answers every
// retry of it with the first delivery's result.
//
// The roles that speak the link live in core/fleet (the server's Connect,
// the host's link loop); nothing here dials, listens or reads a store. The
// server sends no Command yet: its mutations travel as relayed management
// calls with an Idempotency-Key (see host.proto), so the Deduper is the
// host's side of a protocol the server does not use yet.
package hostlink
