// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
)

// DeploymentListCommand lists deployments.
type DeploymentListCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeploymentListCommand) Synopsis() string { return "List deployments" }

// Help implements cli.Command.
func (c *DeploymentListCommand) Help() string {
	return "Usage: capyctl list deployments [--json]\n\n  Lists every deployment with its state. With --json, one object:\n  {\"api_version\", \"deployments\": [...]}, as GET /management/v1/deployments answers.\n\n" + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentListCommand) Run(args []string) int {
	fs := c.FlagSet("list deployments")
	if _, code := c.parse(fs, args); code != 0 {
		return helpOr(code)
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	list, err := cl.Deployments(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		// An object, as every list (engines, servers) and the API's
		// GET /deployments answer.
		c.PrintJSON(wire.DeploymentList{APIVersion: wire.APIVersion, Deployments: list})
		return 0
	}
	if len(list) == 0 {
		fmt.Fprintln(c.Out, "No deployments. Write a job spec and run capyctl deploy --file <spec.hcl>.")
		return 0
	}
	rows := [][]string{}
	for _, d := range list {
		rows = append(rows, []string{d.Name, d.State, fmt.Sprintf("%d/%d", d.ReadyN, len(d.Instances)), fmt.Sprint(d.Revision), d.Engine, d.API, strings.Join(d.Routes, ",")})
	}
	c.Table([]string{"NAME", "STATE", "READY", "REVISION", "ENGINE", "API", "ROUTES"}, rows)
	return 0
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
