// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"os"
	"path/filepath"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine/fakecli"
)

// fakeEngineName is the hidden command that runs the fake engine.
const fakeEngineName = "fake-engine"

// FakeEngineEnv, set to 1 in an engine's environment, lets capyctl run as
// the fake engine when it is invoked under an engine's program name (a
// fake venv's bin/python is a link to capyctl). IMPORTANT: without it a
// capyctl reached through such a link stays the CLI; a renamed binary
// never turns into an engine by surprise.
const FakeEngineEnv = "CAPYCTL_FAKE_ENGINE"

// FakeEngineCommand is the testkit's fake inference engine inside capyctl,
// so that `capyctl dev` needs no other program: `capyctl fake-engine serve
// ...` is a generic OpenAI-compatible engine (dev registers it as a custom
// engine), and capyctl linked as a venv's bin/python (with
// CAPYCTL_FAKE_ENGINE=1) is a fake vLLM. It is hidden from help: the core
// and dev run it, people do not.
type FakeEngineCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *FakeEngineCommand) Synopsis() string {
	return "Run the fake inference engine of capyctl dev (run by the drivers)"
}

// Help implements cli.Command.
func (c *FakeEngineCommand) Help() string {
	return `Usage: capyctl fake-engine serve --served-name NAME [--host H] [--port P] [knobs]

  Runs the fake OpenAI-compatible engine that capyctl dev registers (the
  testkit's capyctl-fake-engine, built in). Its arguments are the fake
  engine's own; the drivers run it, people do not.
`
}

// Run implements cli.Command. RunWith calls it before the CLI reads the
// arguments, which are an engine's (--help and --version included).
func (c *FakeEngineCommand) Run(args []string) int {
	return fakecli.Run("capyctl-fake-engine", args, c.Getenv, c.Out, c.Err)
}

// MaybeRunFakeEngine runs the fake engine when capyctl was invoked as one:
// `capyctl fake-engine ...`, or under an engine's program name with
// CAPYCTL_FAKE_ENGINE=1. ok is false otherwise, and nothing ran.
func MaybeRunFakeEngine(argv []string) (code int, ok bool) {
	if len(argv) == 0 {
		return 0, false
	}
	m := newMeta()
	if len(argv) > 1 && argv[1] == fakeEngineName {
		return (&FakeEngineCommand{Meta: m}).Run(argv[2:]), true
	}
	if m.Getenv(FakeEngineEnv) == "1" && fakecli.EngineName(filepath.Base(argv[0])) {
		return fakecli.Run(argv[0], argv[1:], os.Getenv, os.Stdout, os.Stderr), true
	}
	return 0, false
}
