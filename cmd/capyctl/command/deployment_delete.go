// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import "fmt"

// DeploymentDeleteCommand deletes a deployment.
type DeploymentDeleteCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeploymentDeleteCommand) Synopsis() string { return "Stop and delete a deployment" }

// Help implements cli.Command.
func (c *DeploymentDeleteCommand) Help() string {
	return `Usage: capyctl delete deployment <name>

  Stops every instance, proves its processes gone, then deletes the
  deployment and its revisions. Model files are never deleted.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentDeleteCommand) Run(args []string) int {
	fs := c.FlagSet("delete deployment")
	var wait bool
	fs.BoolVar(&wait, "wait", true, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl delete deployment <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	if err := cl.Delete(c.ctx(), rest[0]); err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(map[string]any{"deleted": rest[0]})
	} else {
		fmt.Fprintf(c.Out, "Deployment %s deleted\n", rest[0])
	}
	return 0
}
