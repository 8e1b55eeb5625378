// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
)

// RoleStatusCommand summarises the running role.
type RoleStatusCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *RoleStatusCommand) Synopsis() string {
	return "Show the running role: endpoints, engines and deployments"
}

// Help implements cli.Command.
func (c *RoleStatusCommand) Help() string {
	return `Usage: capyctl status [--json]

  Shows the role running with the state directory: its version, its
  endpoints, the registered engines (or how to add one) and each
  deployment's state. capyctl status deployment <name> shows one
  deployment in detail.

` + GeneralOptions
}

// RoleStatus is status's JSON answer: the snapshot, and a hint when no
// engine is registered.
type RoleStatus struct {
	*wire.Snapshot
	Hint string `json:"hint,omitempty"`
}

// noEngineHint says how to add an engine.
const noEngineHint = "no engine is registered: add one with capyctl engine add <venv|llama-server>, " +
	"or capyctl engine add --custom <program> --name <name> --manifest <file>"

// Run implements cli.Command.
func (c *RoleStatusCommand) Run(args []string) int {
	fs := c.FlagSet("status")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl status, capyctl status deployment <name> or capyctl status host <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	snap, err := cl.Snapshot(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	out := RoleStatus{Snapshot: snap}
	if len(snap.Engines) == 0 {
		out.Hint = noEngineHint
	}
	if c.JSON() {
		c.PrintJSON(out)
		return 0
	}
	r := snap.Role
	fmt.Fprintf(c.Out, "Role:        %s on %s (pid %d, up %s)\n", r.Role, r.Host, r.PID, time.Since(r.StartedAt).Round(time.Second))
	fmt.Fprintf(c.Out, "Version:     %s (%s)\n", r.Version, r.Commit)
	scheme := "http"
	if r.TLS {
		scheme = "https"
	}
	fmt.Fprintf(c.Out, "Inference:   %s://%s/v1\n", scheme, r.Inference)
	for _, w := range r.Warnings {
		fmt.Fprintf(c.Out, "Warning:     %s\n", w)
	}
	fmt.Fprintf(c.Out, "Management:  %s\n", cl.Base())
	if r.GPU != nil {
		for i, line := range r.GPU.Lines() {
			label := "GPUs:"
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(c.Out, "%-12s %s\n", label, line)
		}
	}
	if r.ModelsRoot != "" {
		fmt.Fprintf(c.Out, "Models:      %s\n", r.ModelsRoot)
	}
	if r.Role == "server" {
		// A cluster of servers: its health at a glance (capyctl list
		// servers has each member).
		if list, err := cl.Servers(c.ctx()); err == nil && list.Raft {
			health := "healthy"
			if list.Degraded {
				health = "degraded"
			}
			leader := list.Leader
			if leader == "" {
				leader = "none (an election, or no quorum: mutations answer not_leader)"
			}
			fmt.Fprintf(c.Out, "Cluster:     %s; leader %s; %d of %d expected voters; this server is %s\n",
				health, leader, list.Voters, list.Expect, list.Self)
		}
	}
	if len(snap.Engines) == 0 {
		fmt.Fprintln(c.Out, "Engines:     none registered")
		fmt.Fprintln(c.Out, "             add one with: capyctl engine add <venv|llama-server>")
		fmt.Fprintln(c.Out, "                       or: capyctl engine add --custom <program> --name <name> --manifest <file>")
	} else {
		names := []string{}
		for _, e := range snap.Engines {
			names = append(names, fmt.Sprintf("%s (%s %s)", e.Name, e.Family, orDash(e.Version)))
		}
		fmt.Fprintf(c.Out, "Engines:     %s\n", strings.Join(names, ", "))
	}
	if rl := snap.RequestLedger; rl != nil {
		fmt.Fprintf(c.Out, "Requests:    %s\n", requestLedgerLine(rl))
	}
	fmt.Fprintln(c.Out)
	if len(snap.Deployments) == 0 {
		fmt.Fprintln(c.Out, "No deployments. Write a job spec and run capyctl deploy --file <spec.hcl>.")
		return 0
	}
	rows := [][]string{}
	for _, d := range snap.Deployments {
		rows = append(rows, []string{d.Name, d.State, fmt.Sprintf("%d/%d", d.ReadyN, len(d.Instances)), fmt.Sprint(d.Revision), d.Engine})
	}
	c.Table([]string{"DEPLOYMENT", "STATE", "READY", "REVISION", "ENGINE"}, rows)
	// The last error of each instance, with its code: a driver's fault
	// names the driver, the call and what to do.
	first := true
	for _, d := range snap.Deployments {
		for _, in := range d.Instances {
			if in.LastError == nil {
				continue
			}
			if first {
				fmt.Fprintln(c.Out)
				first = false
			}
			fmt.Fprintf(c.Out, "%s last error [%s]: %s\n", in.ID, in.LastError.Code, in.LastError.Message)
		}
	}
	return 0
}

// requestLedgerLine summarises the request ledger's writer: whether it
// keeps records and how many it lost.
func requestLedgerLine(rl *wire.RequestLedgerStatus) string {
	if !rl.Enabled {
		return "ledger off"
	}
	line := fmt.Sprintf("ledger on, %d records dropped", rl.Dropped)
	if rl.Dropped > 0 {
		line += " (its queue was full or a commit failed; see capyctl_request_ledger_dropped_total)"
	}
	if rl.LastError != "" {
		line += "; last commit error: " + rl.LastError
	}
	return line
}
