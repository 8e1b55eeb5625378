// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// DeploymentStatusCommand shows a deployment.
type DeploymentStatusCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DeploymentStatusCommand) Synopsis() string {
	return "Show a deployment, its instances and memory"
}

// Help implements cli.Command.
func (c *DeploymentStatusCommand) Help() string {
	return `Usage: capyctl status deployment <name> [--json]

  Shows the deployment's state, revision and each instance: state,
  residency, memory charged, last transition and last error.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentStatusCommand) Run(args []string) int {
	fs := c.FlagSet("status deployment")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl status deployment <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	st, err := cl.Deployment(c.ctx(), rest[0])
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(st)
		return 0
	}
	c.printStatus(st)
	return 0
}

// printStatus renders a deployment for people.
func (c *Meta) printStatus(st *wire.DeploymentStatus) {
	fmt.Fprintf(c.Out, "Name:      %s\n", st.Name)
	fmt.Fprintf(c.Out, "State:     %s (%d/%d ready)\n", st.State, st.ReadyN, len(st.Instances))
	fmt.Fprintf(c.Out, "Desired:   %s\n", st.Desired)
	fmt.Fprintf(c.Out, "Revision:  %d\n", st.Revision)
	fmt.Fprintf(c.Out, "Engine:    %s\n", st.Engine)
	fmt.Fprintf(c.Out, "API:       %s\n", st.API)
	fmt.Fprintf(c.Out, "Routes:    %s\n", strings.Join(st.Routes, ", "))
	if st.Spec != nil && st.Spec.Residency != "" {
		fmt.Fprintf(c.Out, "Residency: %s\n", st.Spec.Residency)
	}
	fmt.Fprintln(c.Out)
	rows := [][]string{}
	for _, in := range st.Instances {
		pid := "-"
		if in.PID > 0 {
			pid = fmt.Sprint(in.PID)
		}
		charged := "-"
		if len(in.Charges) > 0 {
			var parts []string
			for d, b := range in.Charges {
				parts = append(parts, d+"="+structs.FormatBytes(b))
			}
			charged = strings.Join(parts, " ")
		}
		rows = append(rows, []string{
			in.ID, in.State, orDash(in.Residency), pid, charged, age(in.Since),
		})
	}
	c.Table([]string{"INSTANCE", "STATE", "RESIDENCY", "PID", "CHARGED", "SINCE"}, rows)
	for _, in := range st.Instances {
		if in.LastTransition != "" {
			fmt.Fprintf(c.Out, "\n%s last transition: %s\n", in.ID, in.LastTransition)
		}
		if in.Released != "" {
			fmt.Fprintf(c.Out, "%s released: %s\n", in.ID, in.Released)
		}
		if in.LastError != nil {
			fmt.Fprintf(c.Out, "%s last error [%s]: %s\n", in.ID, in.LastError.Code, in.LastError.Message)
		}
	}
	c.printMemory(st)
	if len(st.Requests) > 0 {
		fmt.Fprintln(c.Out)
		for _, k := range sortedKeys(st.Requests) {
			fmt.Fprintf(c.Out, "requests.%s: %v\n", k, st.Requests[k])
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}
