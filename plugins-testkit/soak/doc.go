// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package soak is `make soak`: a seeded, model-based churn run against
// real processes. A standalone role (the capyctl binary, through the
// harness) runs on a simulated GPU with fake engines of every family
// behind their real driver plugins (custom, vLLM, SGLang, llama.cpp,
// TensorFold), and a pool of deployments that do not all fit on the card.
// Operations are drawn at random, with weights, from a generator seeded
// with SOAK_SEED: deploy, update, delete, start, stop, park, wake,
// requests (streamed and not, to models that must switch), hang-ups at
// random points, and kill -9 of an engine, of a driver and of the role
// (then restarted). Some deployments carry short idle timeouts, so the
// role's own timers park and stop models between operations.
//
// After every operation the run checks what must always hold: every
// request ended with an answer or a coded refusal within its bound; no
// instance stayed in a transitional state past its bound; no memory
// domain is charged over its managed limit, and each domain's charge is
// the sum of its owners'; the deployments are those the model expects.
//
// At every quiet point (no request in flight, no instance in transition)
// it checks that what the role holds is back to the baseline of that
// state, within the tolerances of Tolerances: start slots in use (none),
// engine port leases (one per running engine and LMCache server), ledger
// owners (exactly the instances that hold processes, with the same
// charges), admission places (nothing in flight, waiting or waiting for
// an idle reading; no model waiting for a switch), turns (open for every
// deployment with a ready instance), metric series (none of a deleted
// deployment), idle connections to stopped engines (none), engine, shim
// and LMCache process groups (one per running engine or server, none
// without an instance), driver processes (at most one per family), and
// the role's goroutines and open files
// (within a margin of the first reading of the same state); and over the
// run, that the role's resident memory is not growing.
//
// The seed is printed at the start and in every failure, with the last 50
// operations; the last line reads "soak: <N> operations, seed <S>,
// <profile>, nothing leaked", or names what leaked or broke. Profiles:
// short (SOAK_PROFILE=short, at least 500 operations; what `go test` and
// `make test` run) and long (`make soak`: 20,000 operations or 30 minutes,
// whichever comes first, with a table at the end). The fleet profile
// (SOAK_PROFILE=fleet) runs a server and two hosts through the CLI, the
// management API and the inference API only, and adds kill -9 of a host
// agent and of the server.
package soak
