// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import "fmt"

// ServerRemoveCommand takes a server out of the server cluster.
type ServerRemoveCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ServerRemoveCommand) Synopsis() string {
	return "Remove a server from the server cluster"
}

// Help implements cli.Command.
func (c *ServerRemoveCommand) Help() string {
	return `Usage: capyctl remove server <name> [--json]

  Removes a server from the cluster's raft configuration: the leader
  commits the change (a follower relays the command to it) and the
  server no longer votes nor receives the log. Stop the removed server's
  process afterwards; to bring it back, wipe its state directory and join
  it again with a new server join token (capyctl create join-token --role
  server). Removing a voter from a cluster of three leaves two, which
  need both to commit: add a server again soon.

  Refusals: not_found (no such server), not_leader during an election
  (exit 28, retry), unsupported on a server alone.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *ServerRemoveCommand) Run(args []string) int {
	fs := c.FlagSet("remove server")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl remove server <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	if err := cl.RemoveServer(c.ctx(), rest[0]); err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(map[string]any{"removed": rest[0]})
	} else {
		fmt.Fprintf(c.Out, "Server %s removed from the cluster; stop its process\n", rest[0])
	}
	return 0
}
