// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package fsm is the server cluster's replicated state machine: the
// hosts that joined, where each deployment is placed, and the cluster's
// own records (its expected size), each changed only by a typed Command
// committed through the replicated log (core/fleet/raftlog) and applied,
// in the log's order, by every server.
//
// The shape:
//
//   - A command is typed and versioned. Its encoding (Encode) is one JSON
//     envelope: the type's name ("op"), its version ("v"), whether a
//     server that does not know it may skip it ("ignorable"), the
//     leader's clock ("at") and the typed body. As Nomad's FSM does with
//     its IgnoreUnknownTypeFlag: a server that reads a command of a type
//     (or a version of it) it does not know skips it when the writer
//     flagged it ignorable, and otherwise halts (Halted) with a reason
//     naming the command and its index, instead of diverging silently
//     from the servers that applied it. A new release adds commands
//     older servers may skip (a hint, a figure) as ignorable, and any
//     other as a new type the operator upgrades every server for.
//   - Each command's change is written in one bbolt transaction of the
//     role's store together with the log index it was applied at
//     (store.ApplyFleet): an entry at or below the stored index is a
//     replay (raft replays its log after a restart) and is skipped, so a
//     command need not be absolute to be safe to replay.
//   - Reads are from memory. Every apply publishes the new applied index
//     on a change signal (Changed, the core/routes Board's shape): a
//     waiter takes the channel, reads, and waits on it; nothing polls.
//   - A snapshot is the whole state encoded (Snapshot); Restore replaces
//     the state with one in one transaction.
//
// Records written before this package (the "op" commands of the first
// releases, without a version) still decode: their fields are the bodies
// of the same types at version 0.
package fsm
