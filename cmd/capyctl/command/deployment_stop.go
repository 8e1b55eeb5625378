// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"

	"github.com/capyctl/capyctl/core/api/wire"
)

// DeploymentStopCommand stops a deployment.
type DeploymentStopCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeploymentStopCommand) Synopsis() string { return "Stop every instance of a deployment" }

// Help implements cli.Command.
func (c *DeploymentStopCommand) Help() string {
	return `Usage: capyctl stop deployment <name> [--wait]

  Marks the deployment stopped (requests for it get 409 deployment_stopped
  until it is started again) and stops its engines: SIGTERM to each
  engine's process group, SIGKILL after the grace period, then proof that
  no process is left.

Stop Options:

  --wait            Return once every engine is proven gone.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentStopCommand) Run(args []string) int {
	fs := c.FlagSet("stop deployment")
	var wait bool
	fs.BoolVar(&wait, "wait", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl stop deployment <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	acc, err := cl.Action(c.ctx(), rest[0], wire.ActionRequest{Action: "stop", Wait: wait})
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(acc)
	} else if acc.Done {
		fmt.Fprintf(c.Out, "Deployment %s stopped\n", rest[0])
	} else {
		fmt.Fprintf(c.Out, "Stop of %s accepted\n", rest[0])
	}
	return 0
}
