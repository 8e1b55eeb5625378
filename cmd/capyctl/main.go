// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command capyctl is CapyCTL: the CLI, every role, the first-party engine
// drivers (run out of process as `capyctl driver <family>`) and the fake
// engine of `capyctl dev` (`capyctl fake-engine`).
package main

import (
	"os"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/cmd/capyctl/internal/sysmonpace"
	"github.com/capyctl/capyctl/sdk/proc"
)

func main() {
	// A launch supervisor ("shim") is this binary re-executed; it must take
	// over before anything else runs.
	proc.MaybeRunShim()
	// The fake engine takes an engine's argv as it is, before the CLI
	// reads any of it.
	if code, ok := command.MaybeRunFakeEngine(os.Args); ok {
		os.Exit(code)
	}
	// A role's process runs with the runtime's system monitor at its own
	// pace: this may re-execute the binary once (see sysmonpace).
	sysmonpace.Settle(os.Args)
	os.Exit(command.Run(os.Args[1:]))
}
