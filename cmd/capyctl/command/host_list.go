// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
)

// HostListCommand lists the machines that run engines.
type HostListCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *HostListCommand) Synopsis() string { return "List the machines that run engines" }

// Help implements cli.Command.
func (c *HostListCommand) Help() string {
	return `Usage: capyctl list hosts [--json]

  Lists the machines that run engines: name, role, online, GPUs and the
  engines registered there. A standalone role lists itself.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *HostListCommand) Run(args []string) int {
	fs := c.FlagSet("list hosts")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl list hosts")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	hosts, err := cl.Hosts(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(hosts)
		return 0
	}
	rows := [][]string{}
	for _, h := range hosts {
		online := "no"
		if h.Online {
			online = "yes"
		}
		gpus := []string{}
		for _, g := range h.GPUs {
			gpus = append(gpus, fmt.Sprintf("%d:%s %s", g.Index, g.Name, structs.FormatBytes(g.TotalBytes)))
		}
		rows = append(rows, []string{h.Name, h.Role, online, orDash(strings.Join(gpus, ", ")), orDash(strings.Join(h.Engines, ","))})
	}
	c.Table([]string{"NAME", "ROLE", "ONLINE", "GPUS", "ENGINES"}, rows)
	return 0
}
