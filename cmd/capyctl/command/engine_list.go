// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strings"
)

// EngineListCommand lists registered engines.
type EngineListCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *EngineListCommand) Synopsis() string { return "List registered engines" }

// Help implements cli.Command.
func (c *EngineListCommand) Help() string {
	return "Usage: capyctl engine list [--json]\n\n  Lists every registered engine: family, version, verified or custom, path.\n\n" + GeneralOptions
}

// Run implements cli.Command.
func (c *EngineListCommand) Run(args []string) int {
	fs := c.FlagSet("engine list")
	if _, code := c.parse(fs, args); code != 0 {
		return helpOr(code)
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	list, err := cl.Engines(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(list)
		return 0
	}
	if len(list.Engines) == 0 {
		fmt.Fprintln(c.Out, "No engine is registered.")
		fmt.Fprintln(c.Out, "Add one with: capyctl engine add <venv|llama-server>")
		fmt.Fprintln(c.Out, "          or: capyctl engine add --custom <program> --name <name> --manifest <file>")
		return 0
	}
	rows := [][]string{}
	for _, e := range list.Engines {
		v := "custom"
		if e.Verified {
			v = "verified"
		}
		rows = append(rows, []string{e.Name, e.Family, orDash(e.Version), v, e.Path, orDash(strings.Join(e.UsedBy, ","))})
	}
	c.Table([]string{"NAME", "FAMILY", "VERSION", "STATUS", "PATH", "USED BY"}, rows)
	return 0
}
