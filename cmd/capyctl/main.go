// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command capyctl is CapyCTL: the CLI, every role, and the first-party
// engine drivers (run out of process as `capyctl driver <family>`).
package main

import (
	"os"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/sdk/proc"
)

func main() {
	// A launch supervisor ("shim") is this binary re-executed; it must take
	// over before anything else runs.
	proc.MaybeRunShim()
	os.Exit(command.Run(os.Args[1:]))
}
