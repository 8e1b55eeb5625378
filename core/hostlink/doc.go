// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package hostlink holds the plumbing of the host link, the one long-lived
// gRPC stream a GPU host opens to its server (proto/hostv1/host.proto
// documents every message): for now the host's side of command
// idempotency, Deduper, which runs each command_id once and answers every
// retry of it with the first delivery's result.
//
// IMPORTANT: the roles that speak the link (capyctl start server, start
// host) are not built yet (issue 16 item 1); nothing here dials, listens or
// reads a store. The relay of inference requests (item 4) is not defined
// yet either.
package hostlink
