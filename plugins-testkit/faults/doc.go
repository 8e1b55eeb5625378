// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package faults is the fault-injection suite: it runs a standalone role
// (the real binary, through the harness) on a simulated GPU with two
// deployments on the testkit's fake engine, puts steady traffic on one of
// them (streams kept open and non-streamed requests on a ticker, loopback
// only, every request with a deadline), injects one fault at a time and
// measures one row per fault: the requests that failed and with what
// code, how long until the role served again, the engines that survived,
// the deployments and records lost, and whether the memory ledger still
// agrees with the instances and the processes.
//
// Each fault runs on a fresh role, so a row never carries the damage of
// the one before. `make faults` runs the whole suite at full scale
// (CAPYCTL_FAULTS=1); `make test` runs two faults at a small scale so the
// code cannot rot. The measured table is in
// website/content/operations/faults.md.
package faults
