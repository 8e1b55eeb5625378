// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import "fmt"

// EngineRemoveCommand removes an engine registration.
type EngineRemoveCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *EngineRemoveCommand) Synopsis() string { return "Remove an engine registration" }

// Help implements cli.Command.
func (c *EngineRemoveCommand) Help() string {
	return `Usage: capyctl engine remove <name>

  Removes the registration (never the installation's files). Refused while
  a deployment uses the engine (engine_in_use, exit 20).

` + GeneralOptions
}

// Run implements cli.Command.
func (c *EngineRemoveCommand) Run(args []string) int {
	fs := c.FlagSet("engine remove")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl engine remove <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	if err := cl.RemoveEngine(c.ctx(), rest[0]); err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(map[string]string{"removed": rest[0]})
	} else {
		fmt.Fprintf(c.Out, "Engine %s removed\n", rest[0])
	}
	return 0
}
