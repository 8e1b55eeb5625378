// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"

	"github.com/capyctl/capyctl/core/api/client"
)

// HostDrainCommand drains a joined host, or resumes it.
type HostDrainCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *HostDrainCommand) Synopsis() string {
	return "Stop new placements on a host (running instances stay)"
}

// Help implements cli.Command.
func (c *HostDrainCommand) Help() string {
	return `Usage: capyctl drain host <name> [--resume] [--json]

  Drains a host joined to the server: the server places no new instance
  there, and the instances already on it stay and keep serving until you
  stop them (capyctl stop instance). Then remove the host (capyctl remove
  host) or resume it. A placement that needs a draining host is refused
  with host_draining (exit 4).

  Only a server has joined hosts: a standalone role refuses with
  unsupported (exit 5).

Drain Options:

  --resume          Take new placements on the host again.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *HostDrainCommand) Run(args []string) int {
	fs := c.FlagSet("drain host")
	var resume bool
	fs.BoolVar(&resume, "resume", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl drain host <name> [--resume]")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	action := client.HostActionDrain
	if resume {
		action = client.HostActionResume
	}
	h, err := cl.HostAction(c.ctx(), rest[0], action)
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(h)
		return 0
	}
	if resume {
		fmt.Fprintf(c.Out, "Host %s resumed: it takes new placements again (state %s)\n", h.Name, orDash(h.State))
		return 0
	}
	fmt.Fprintf(c.Out, "Host %s draining: no new placements; its %d instance(s) stay (state %s)\n", h.Name, len(h.Instances), orDash(h.State))
	fmt.Fprintf(c.Out, "Resume with: capyctl drain host %s --resume\n", h.Name)
	return 0
}
