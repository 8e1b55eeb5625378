// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
)

// InstanceActionCommand is `start|stop|park instance <deployment>/<index>`.
type InstanceActionCommand struct {
	*Meta
	action string
}

// Synopsis implements cli.Command.
func (c *InstanceActionCommand) Synopsis() string {
	return fmt.Sprintf("%s one instance of a deployment", strings.ToUpper(c.action[:1])+c.action[1:])
}

// Help implements cli.Command.
func (c *InstanceActionCommand) Help() string {
	return fmt.Sprintf(`Usage: capyctl %s instance <deployment>/<index> [--wait]

  Acts on one instance (instances are numbered from 0; status deployment
  lists them as <deployment>/<index>).

Options:

  --wait            Return once the action completed.

`, c.action) + GeneralOptions
}

// Run implements cli.Command.
func (c *InstanceActionCommand) Run(args []string) int {
	fs := c.FlagSet(c.action + " instance")
	var wait bool
	fs.BoolVar(&wait, "wait", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl %s instance <deployment>/<index>", c.action)
	}
	name, idxText, ok := strings.Cut(rest[0], "/")
	idx, err := strconv.Atoi(idxText)
	if !ok || name == "" || err != nil || idx < 0 {
		return c.Usage("%q is not <deployment>/<index> (demo/0)", rest[0])
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	acc, err := cl.InstanceAction(c.ctx(), name, idx, wire.ActionRequest{Action: c.action, Wait: wait})
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(acc)
	} else if acc.Done {
		fmt.Fprintf(c.Out, "Instance %s/%d: %s done\n", name, idx, c.action)
	} else {
		fmt.Fprintf(c.Out, "Instance %s/%d: %s accepted\n", name, idx, c.action)
	}
	return 0
}
