// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// HostStatusCommand shows one host.
type HostStatusCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *HostStatusCommand) Synopsis() string {
	return "Show a host: its state, link, cards and instances"
}

// Help implements cli.Command.
func (c *HostStatusCommand) Help() string {
	return `Usage: capyctl status host <name> [--json]

  Shows one host: its state (ready, draining or lost), the address and
  version of its link, when the server last heard from it, when its
  certificate expires, its cards, and the instances it reported in its
  last journal with their state and charges.

  On a server, the name is a joined host (capyctl list hosts lists them);
  an unknown name is not_found (exit 2). A standalone role shows itself
  under its own name; the figures only a server keeps read "-" there, and
  capyctl status lists its deployments.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *HostStatusCommand) Run(args []string) int {
	fs := c.FlagSet("status host")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl status host <name>")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	h, err := cl.Host(c.ctx(), rest[0])
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(h)
		return 0
	}
	c.printHost(h)
	return 0
}

// hostStateNotes say what a host state means for placements.
var hostStateNotes = map[string]string{
	wire.HostReady:    "takes new placements",
	wire.HostDraining: "no new placements; running instances stay",
	wire.HostLost:     "its link is down; its instances read uncertain and keep their charges until it comes back",
}

// printHost renders one host for people.
func (c *Meta) printHost(h *wire.HostDetail) {
	now := c.now()
	f := fleetCells(h.Host, now)
	state := f.state
	if note := hostStateNotes[h.State]; note != "" {
		state += " (" + note + ")"
	}
	fmt.Fprintf(c.Out, "Name:          %s\n", h.Name)
	fmt.Fprintf(c.Out, "Role:          %s\n", orDash(h.Role))
	fmt.Fprintf(c.Out, "State:         %s\n", state)
	fmt.Fprintf(c.Out, "Online:        %s\n", yesNo(h.Online))
	fmt.Fprintf(c.Out, "Address:       %s\n", f.address)
	fmt.Fprintf(c.Out, "Version:       %s\n", orDash(h.Version))
	fmt.Fprintf(c.Out, "Charged:       %s\n", f.charged)
	fmt.Fprintf(c.Out, "Last seen:     %s\n", withTimestamp(f.lastSeen, h.LastSeen))
	fmt.Fprintf(c.Out, "Cert expires:  %s\n", withTimestamp(f.certExpires, h.CertExpiresAt))
	fmt.Fprintf(c.Out, "Engines:       %s\n", orDash(strings.Join(h.Engines, ", ")))
	if h.State == wire.HostDraining {
		fmt.Fprintf(c.Out, "\nResume placements with: capyctl drain host %s --resume\n", h.Name)
	}

	fmt.Fprintln(c.Out)
	if len(h.GPUs) == 0 {
		fmt.Fprintln(c.Out, "No cards reported.")
	} else {
		rows := [][]string{}
		for _, g := range h.GPUs {
			rows = append(rows, []string{fmt.Sprint(g.Index), g.Name, structs.FormatBytes(g.TotalBytes), structs.FormatBytes(g.UsedBytes), orDash(g.UUID)})
		}
		c.Table([]string{"CARD", "NAME", "MEMORY", "USED", "UUID"}, rows)
	}

	fmt.Fprintln(c.Out)
	switch {
	case h.State == "":
		// A standalone role answers for itself and lists no instances here.
		fmt.Fprintln(c.Out, "capyctl status lists this role's deployments and instances.")
	case len(h.Instances) == 0:
		fmt.Fprintln(c.Out, "No instances reported.")
	default:
		rows := [][]string{}
		for _, in := range h.Instances {
			since := "-"
			if !in.Since.IsZero() {
				since = ago(in.Since, now)
			}
			rows = append(rows, []string{in.InstanceID, in.Deployment, in.State, chargesCell(in.Charges), since})
		}
		c.Table([]string{"INSTANCE", "DEPLOYMENT", "STATE", "CHARGED", "SINCE"}, rows)
	}
}

// withTimestamp adds the UTC time to a relative one: "3s ago
// (2026-12-02T00:29:31Z)".
func withTimestamp(rel string, t *time.Time) string {
	if t == nil || rel == "-" {
		return rel
	}
	return rel + " (" + t.UTC().Format(time.RFC3339) + ")"
}

// chargesCell prints charges per memory domain, sorted by domain:
// "gpu0=12GiB system=2GiB".
func chargesCell(charges map[string]int64) string {
	if len(charges) == 0 {
		return "-"
	}
	domains := make([]string, 0, len(charges))
	for d := range charges {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	parts := make([]string, 0, len(domains))
	for _, d := range domains {
		parts = append(parts, d+"="+structs.FormatBytes(charges[d]))
	}
	return strings.Join(parts, " ")
}
