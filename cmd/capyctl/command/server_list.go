// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strconv"
)

// ServerListCommand lists the servers of the server cluster.
type ServerListCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ServerListCommand) Synopsis() string { return "List the servers of the server cluster" }

// Help implements cli.Command.
func (c *ServerListCommand) Help() string {
	return `Usage: capyctl list servers [--json]

  Lists the servers of the cluster (raft) as the server asked answers,
  one row each; the server asks each member for its own figures:

    NAME        the server's name (its --hostname)
    STATE       leader, follower, candidate, or unreachable when the
                answering server could not ask it
    VOTER       whether it votes
    TERM        its raft term
    LAST INDEX  the last entry of its log; APPLIED the last its state
                applied (a follower that catches up shows it growing)
    LEADER      the leader as that server sees it
    ADDRESS     its cluster address (raft's traffic goes there too)

  Below the table: the leader, and "degraded" while fewer voters than
  bootstrap_expect are in the configuration or a voter is unreachable.
  A server alone (no --bootstrap-expect above 1, no --join) lists itself.
  Only a server has servers: a standalone role refuses with unsupported
  (exit 5).

` + GeneralOptions
}

// Run implements cli.Command.
func (c *ServerListCommand) Run(args []string) int {
	fs := c.FlagSet("list servers")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl list servers")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	list, err := cl.Servers(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(list)
		return 0
	}
	rows := [][]string{}
	num := func(n uint64) string {
		if n == 0 {
			return "-"
		}
		return strconv.FormatUint(n, 10)
	}
	for _, s := range list.Servers {
		rows = append(rows, []string{s.Name, s.State, yesNo(s.Voter), num(s.Term), num(s.LastIndex), num(s.AppliedIndex), orDash(s.Leader), s.Address})
	}
	c.Table([]string{"NAME", "STATE", "VOTER", "TERM", "LAST INDEX", "APPLIED", "LEADER", "ADDRESS"}, rows)
	health := "healthy"
	if list.Degraded {
		health = "degraded"
	}
	fmt.Fprintf(c.Out, "\nLeader: %s; %d of %d expected voters; %s\n", orDash(list.Leader), list.Voters, list.Expect, health)
	return 0
}
