// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package proc runs engine processes for drivers: launch in a process group
// of their own, identities that survive PID reuse, log capture
// with redaction, graceful and forced stop with proof of exit, and readings
// from /proc (listening sockets, tree memory).
//
// An engine must outlive its driver and the core: both may be killed with
// SIGKILL and relaunched, and the relaunched driver re-attaches through the
// recorded identities. So the engine's output is never a pipe to the driver.
// Start launches a small supervisor, the shim (a re-execution of the current
// executable), as the leader of a new process group (in the caller's
// session: see newShim); the shim starts the engine as
// its child in the same process group, copies the engine's stdout and stderr
// through a redacting writer into a ring buffer and, in file mode, a rotated
// log file, records the exit status in exit.json, and serves a unix socket
// (shim.sock) for status and log tails. Its launch directory is private
// (0700).
//
// IMPORTANT: every binary that calls Start must call MaybeRunShim first thing
// in main (the capyctl binary and sdk/plugin.Serve do). A test binary does it
// in TestMain.
//
// The process functions work on Linux only (they read /proc); elsewhere they
// return ErrUnsupported. The Redactor and the Ring work everywhere.
package proc
