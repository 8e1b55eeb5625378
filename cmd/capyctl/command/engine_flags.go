// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import "strings"

// EngineFlagsCommand prints a family's flag policy.
type EngineFlagsCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *EngineFlagsCommand) Synopsis() string {
	return "Print which engine options CapyCTL owns, reserves, gates or passes"
}

// Help implements cli.Command.
func (c *EngineFlagsCommand) Help() string {
	return `Usage: capyctl engine flags <family> [--format json]

  Prints the flag-policy table of an engine family: every option and
  environment name CapyCTL owns (renders itself), reserves (refused in any
  spelling), gates behind a host approval, or passes unchanged, and why.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *EngineFlagsCommand) Run(args []string) int {
	fs := c.FlagSet("engine flags")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl engine flags <family>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	t, err := cl.Flags(c.ctx(), rest[0])
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(t)
		return 0
	}
	rows := [][]string{}
	for _, r := range t.Rules {
		name := r.Name
		if len(r.Aliases) > 0 {
			name += " (" + strings.Join(r.Aliases, ", ") + ")"
		}
		class := r.Class
		if r.Approval != "" {
			class += ":" + r.Approval
		}
		rows = append(rows, []string{name, r.Kind, class, r.Reason})
	}
	c.Table([]string{"NAME", "KIND", "CLASS", "REASON"}, rows)
	return 0
}
