// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package hostlink holds the plumbing of the host link, the one long-lived
// gRPC stream a GPU host opens to its server (proto/hostv1/host.proto
// documents every message): the host's side of command idempotency,
// Deduper, which runs each command_id once and answers every retry of it
// with the first delivery's result, and Handler, what a host does with
// each command.
//
// The roles that speak the link live in core/fleet (the server's Connect,
// the host's link loop); nothing here dials, listens or reads a store. The
// leader sends a Command for what is not desired state (a deployment's or
// an instance's park, an instance's start or stop), with its raft term; a
// host runs it through its Deduper and answers one CommandResult.
package hostlink
