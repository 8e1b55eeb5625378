// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command capyctl-fake-engine is the testkit's fake inference engine as a
// program of its own (plugins-testkit/fakeengine/fakecli has the command
// line): the harness and the conformance suite install it under a real
// engine's name (a venv's bin/python, llama-server, tensorfold) or run it
// as `capyctl-fake-engine serve`. capyctl runs the same code as the hidden
// `capyctl fake-engine`.
package main

import (
	"os"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine/fakecli"
)

func main() {
	os.Exit(fakecli.Run(os.Args[0], os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
