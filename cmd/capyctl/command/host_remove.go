// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import "fmt"

// HostRemoveCommand removes a joined host from the server.
type HostRemoveCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *HostRemoveCommand) Synopsis() string {
	return "Remove a host: revoke its certificate and close its link"
}

// Help implements cli.Command.
func (c *HostRemoveCommand) Help() string {
	return `Usage: capyctl remove host <name> [--json]

  Removes a host joined to the server, at once and without asking: the
  server revokes the host's certificate (every new connection with it is
  refused with host_revoked), closes its link and forgets it. To let its
  instances finish first, drain it (capyctl drain host) and stop them.

  A host removed by mistake joins again with a new token (capyctl create
  join-token). Only a server has joined hosts: a standalone role refuses
  with unsupported (exit 5).

` + GeneralOptions
}

// Run implements cli.Command.
func (c *HostRemoveCommand) Run(args []string) int {
	fs := c.FlagSet("remove host")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl remove host <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	if err := cl.RemoveHost(c.ctx(), rest[0]); err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(map[string]any{"removed": rest[0]})
	} else {
		fmt.Fprintf(c.Out, "Host %s removed: its certificate is revoked and its link closed\n", rest[0])
		fmt.Fprintln(c.Out, "It joins again only with a new token: capyctl create join-token")
	}
	return 0
}
