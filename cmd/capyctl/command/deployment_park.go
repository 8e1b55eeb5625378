// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"

	"github.com/capyctl/capyctl/core/api/wire"
)

// DeploymentParkCommand parks a deployment.
type DeploymentParkCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeploymentParkCommand) Synopsis() string {
	return "Park every ready instance of a deployment, freeing its GPU memory"
}

// Help implements cli.Command.
func (c *DeploymentParkCommand) Help() string {
	return `Usage: capyctl park deployment <name> [--wait]

  Parks the deployment's ready instances: the engine drops its weights and
  KV cache (deep) or moves its weights to host RAM (host_backed) and stays
  alive; the next request wakes it. A restart_only deployment is stopped
  instead.

Park Options:

  --wait            Return once every instance is parked.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentParkCommand) Run(args []string) int {
	fs := c.FlagSet("park deployment")
	var wait bool
	fs.BoolVar(&wait, "wait", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl park deployment <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	acc, err := cl.Action(c.ctx(), rest[0], wire.ActionRequest{Action: wire.ActionPark, Wait: wait})
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(acc)
	} else if acc.Done {
		st, err := cl.Deployment(c.ctx(), rest[0])
		if err != nil {
			return c.Fail(err)
		}
		switch st.State {
		case "parked":
			fmt.Fprintf(c.Out, "Deployment %s parked; the next request wakes it\n", rest[0])
		case "stopped":
			fmt.Fprintf(c.Out, "Deployment %s stopped: it runs restart_only, so a park stops it; the next request starts it\n", rest[0])
		default:
			fmt.Fprintf(c.Out, "Deployment %s: %s\n", rest[0], st.State)
		}
	} else {
		fmt.Fprintf(c.Out, "Park of %s accepted\n", rest[0])
	}
	return 0
}
