// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
)

// DeploymentStartCommand starts (or wakes) a deployment.
type DeploymentStartCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeploymentStartCommand) Synopsis() string {
	return "Start or wake every instance of a deployment"
}

// Help implements cli.Command.
func (c *DeploymentStartCommand) Help() string {
	return `Usage: capyctl start deployment <name> [--wait] [--evict]

  Marks the deployment running: parked instances wake in place, stopped
  ones start. Without --wait it returns once the start is accepted.

Start Options:

  --wait            Wait until every instance is ready. A start that gives
                    up ends the wait at once with the reason (exit 13);
                    no room is exit 4.
  --timeout DUR     Bound for --wait (default 30m).
  --evict           Make room by parking or stopping idle models.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentStartCommand) Run(args []string) int {
	fs := c.FlagSet("start deployment")
	var wait, evict bool
	var timeout string
	fs.BoolVar(&wait, "wait", false, "")
	fs.BoolVar(&evict, "evict", false, "")
	fs.StringVar(&timeout, "timeout", "30m", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl start deployment <name>")
	}
	tmo, err := time.ParseDuration(timeout)
	if err != nil {
		return c.Usage("--timeout: %v", err)
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	since := time.Now().UTC()
	acc, err := cl.Action(c.ctx(), rest[0], wire.ActionRequest{Action: "start", Evict: evict})
	if err != nil {
		return c.Fail(err)
	}
	if !wait {
		if c.JSON() {
			c.PrintJSON(acc)
		} else {
			fmt.Fprintf(c.Out, "Start of %s accepted\n", rest[0])
		}
		return 0
	}
	return c.waitReady(cl, rest[0], since, tmo)
}

// waitReady polls until ready, printing progress on a terminal.
func (c *Meta) waitReady(cl *client.Client, name string, since time.Time, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tty := isTerminal(c.Err) && !c.JSON()
	start := time.Now()
	st, err := cl.WaitReady(ctx, name, since, func(st *wire.DeploymentStatus) {
		if tty {
			fmt.Fprintf(c.Err, "  %s: %s (%s)\n", name, st.State, time.Since(start).Round(100*time.Millisecond))
		}
	})
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(st)
	} else {
		fmt.Fprintf(c.Out, "Deployment %s is ready (%d/%d instances) in %s\n", name, st.ReadyN, len(st.Instances), time.Since(start).Round(time.Millisecond))
	}
	return 0
}
