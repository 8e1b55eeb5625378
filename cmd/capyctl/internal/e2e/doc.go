// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package e2e holds what the end-to-end test packages under cmd/capyctl/e2e
// share: a role with the demo deployment, a role on one simulated card
// with fake vLLM engines (role.go), and a fleet of a server and hosts, each
// a separate capyctl process, driven through the CLI and the APIs
// (fleet.go). The processes themselves are plugins-testkit/harness's; this
// package only composes them the way several test themes need.
//
// A helper one theme uses stays in that theme's package; it moves here,
// exported, when a second theme needs it. cmd/capyctl/e2e/README.md says
// which theme a test belongs to.
package e2e
