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

// HostListCommand lists the machines that run engines.
type HostListCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *HostListCommand) Synopsis() string { return "List the machines that run engines" }

// Help implements cli.Command.
func (c *HostListCommand) Help() string {
	return `Usage: capyctl list hosts [--json]

  Lists the machines that run engines, one row each:

    NAME, ROLE, ONLINE  the host's name, its role, and whether it answers
    STATE               ready, draining (no new placements; running
                        instances stay) or lost (its link is down)
    ADDRESS             the host's address as the server sees its link
    CARDS               its GPUs, grouped by model and memory
    CHARGED             memory its ledger charges, all domains together
    LAST SEEN           when the server last heard from it
    CERT EXPIRES        when its certificate expires (the host renews it
                        by itself at two thirds of its life)
    ENGINES             the engines registered there

  A server lists its joined hosts. A standalone role lists itself and
  leaves STATE, ADDRESS, CHARGED, LAST SEEN and CERT EXPIRES as "-".
  capyctl status host <name> shows one host in detail.

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
	now := c.now()
	rows := [][]string{}
	for _, h := range hosts {
		f := fleetCells(h, now)
		rows = append(rows, []string{
			h.Name, h.Role, yesNo(h.Online), f.state, f.address, cardsSummary(h.GPUs), f.charged, f.lastSeen, f.certExpires,
			orDash(strings.Join(h.Engines, ",")),
		})
	}
	c.Table([]string{"NAME", "ROLE", "ONLINE", "STATE", "ADDRESS", "CARDS", "CHARGED", "LAST SEEN", "CERT EXPIRES", "ENGINES"}, rows)
	return 0
}

// hostCells are a host's figures that only a server reports, formatted for
// people.
type hostCells struct {
	state, address, charged, lastSeen, certExpires string
}

// fleetCells formats the figures a server keeps about a joined host. A
// host without a state comes from a standalone role, which keeps none of
// them: every cell reads "-" (its charges are in its ledger, not in
// ChargedBytes, so "0B" would be wrong there).
func fleetCells(h wire.Host, now time.Time) hostCells {
	if h.State == "" {
		return hostCells{"-", "-", "-", "-", "-"}
	}
	out := hostCells{state: h.State, address: orDash(h.Address), charged: structs.FormatBytes(h.ChargedBytes), lastSeen: "-", certExpires: "-"}
	if h.LastSeen != nil {
		out.lastSeen = ago(*h.LastSeen, now)
	}
	if h.CertExpiresAt != nil {
		out.certExpires = until(*h.CertExpiresAt, now)
	}
	return out
}

// cardsSummary groups a host's GPUs by model and memory: "8x H100 80GiB",
// "GB10 119.7GiB", "-" for none. status host lists each card.
func cardsSummary(gpus []wire.GPU) string {
	type group struct {
		label string
		n     int
	}
	var groups []*group
	seen := map[string]*group{}
	for _, g := range gpus {
		label := strings.TrimSpace(g.Name + " " + structs.FormatBytes(g.TotalBytes))
		if gr := seen[label]; gr != nil {
			gr.n++
			continue
		}
		gr := &group{label: label, n: 1}
		seen[label] = gr
		groups = append(groups, gr)
	}
	parts := make([]string, 0, len(groups))
	for _, gr := range groups {
		if gr.n == 1 {
			parts = append(parts, gr.label)
		} else {
			parts = append(parts, fmt.Sprintf("%dx %s", gr.n, gr.label))
		}
	}
	return orDash(strings.Join(parts, ", "))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// ago says how long before now t was: "12s ago", "4m ago", "3h20m ago",
// "2d4h ago".
func ago(t, now time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		d = 0 // clocks of two machines: a heartbeat "from the future" is now
	}
	return shortDuration(d) + " ago"
}

// until says how long after now t is ("in 15h59m"), or how long ago it
// passed ("expired 3m ago").
func until(t, now time.Time) string {
	d := t.Sub(now)
	if d <= 0 {
		return "expired " + shortDuration(-d) + " ago"
	}
	return "in " + shortDuration(d)
}

// shortDuration prints d to the two largest units that matter to an
// operator: "45s", "12m", "3h20m", "2d4h". It rounds to the smallest unit
// shown.
func shortDuration(d time.Duration) string {
	switch {
	case d.Round(time.Second) < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second)/time.Second))
	case d.Round(time.Minute) < time.Hour:
		return fmt.Sprintf("%dm", int(d.Round(time.Minute)/time.Minute))
	case d.Round(time.Minute) < 48*time.Hour:
		m := int(d.Round(time.Minute) / time.Minute)
		if m%60 == 0 {
			return fmt.Sprintf("%dh", m/60)
		}
		return fmt.Sprintf("%dh%dm", m/60, m%60)
	default:
		h := int(d.Round(time.Hour) / time.Hour)
		if h%24 == 0 {
			return fmt.Sprintf("%dd", h/24)
		}
		return fmt.Sprintf("%dd%dh", h/24, h%24)
	}
}
