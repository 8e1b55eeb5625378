// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
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
	return `Usage: capyctl status deployment <name> [--watch] [--json]

  Shows the deployment's state, revision and each instance: state,
  residency, memory charged, last transition and last error.

Status Options:

  --watch           Keep watching: after the status, print a line (with
                    --json, the whole status) each time the deployment
                    changes, following the management event stream. Ends
                    on Ctrl-C, or when the deployment is deleted.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *DeploymentStatusCommand) Run(args []string) int {
	fs := c.FlagSet("status deployment")
	var watch bool
	fs.BoolVar(&watch, "watch", false, "")
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
	if watch {
		return c.watchDeployment(cl, rest[0])
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
	if g := st.Group; g != nil {
		fmt.Fprintf(c.Out, "Group:     %d hosts (%s), tensor_parallel %d × pipeline_parallel %d\n",
			g.Size, strings.Join(g.Hosts, ", "), g.TensorParallel, g.PipelineParallel)
		fmt.Fprintf(c.Out, "Peers:     rendezvous %s; peer transport %s: keep the group's hosts on a private direct link\n", g.Rendezvous, g.PeerTransport)
		if g.LastError != nil {
			fmt.Fprintf(c.Out, "Stopped:   [%s] %s (%s)\n", g.LastError.Code, g.LastError.Message, g.LastError.At.Format(time.RFC3339))
		}
	}
	fmt.Fprintln(c.Out)
	rows := [][]string{}
	onHosts := false
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
		if in.Host != "" {
			onHosts = true
		}
	}
	head := []string{"INSTANCE", "STATE", "RESIDENCY", "PID", "CHARGED", "SINCE"}
	if onHosts { // a server's answer: each instance's host
		head = append(head[:1], append([]string{"HOST"}, head[1:]...)...)
		for i, in := range st.Instances {
			rows[i] = append(rows[i][:1], append([]string{in.Host}, rows[i][1:]...)...)
		}
	}
	if st.Group != nil { // a group's members: rank and role
		head = append(head[:2], append([]string{"RANK"}, head[2:]...)...)
		head[0] = "MEMBER"
		for i, in := range st.Instances {
			rank := "-"
			if in.Rank != nil {
				rank = fmt.Sprintf("%d %s", *in.Rank, in.Role)
			}
			rows[i] = append(rows[i][:2], append([]string{rank}, rows[i][2:]...)...)
		}
	}
	c.Table(head, rows)
	for _, in := range st.Instances {
		if in.LastTransition != "" {
			fmt.Fprintf(c.Out, "\n%s last transition: %s\n", in.ID, in.LastTransition)
		}
		if in.Released != "" {
			fmt.Fprintf(c.Out, "%s released: %s\n", in.ID, in.Released)
		}
		if in.ParkTier != "" {
			fmt.Fprintf(c.Out, "%s parked at: %s%s\n", in.ID, in.ParkTier, parkTierNote(in.ParkTier, in.ParkDetail))
		}
		if t := in.Timings; t != nil {
			fmt.Fprintf(c.Out, "%s measured: %s\n", in.ID, timingsLine(t))
		}
		if x := in.Exposure; x != nil {
			fmt.Fprintf(c.Out, "%s exposure: %s\n", in.ID, exposureLine(x))
		}
		if p := in.Parsers; p != nil {
			fmt.Fprintf(c.Out, "%s Parsers: tool calls %s, reasoning %s (%s)\n", in.ID, orNone(p.ToolCall), orNone(p.Reasoning), orDash(p.Provenance))
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

// exposureLine says who besides CapyCTL reaches an engine: nobody on a
// socket; on TCP, the routes any local user can call without the key.
func exposureLine(x *structs.Exposure) string {
	var s string
	switch {
	case x.Listener == "unix":
		s = "unix socket in the launch directory (only the role's user)"
	case x.Listener == "netns":
		s = "network namespace of its own (only the role's user)"
		return s
	case len(x.OpenRoutes) == 1 && x.OpenRoutes[0] == "*":
		s = "loopback TCP: every route answers any local user"
	case len(x.OpenRoutes) > 0:
		s = "loopback TCP: " + strings.Join(x.OpenRoutes, ", ") + " answer any local user without the key"
	default:
		s = "loopback TCP"
	}
	if x.Note != "" {
		s += " (" + x.Note + ")"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
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

// errDeleted ends a watch when the deployment is deleted.
var errDeleted = errors.New("deleted")

// watchDeployment prints the status, then a line per change, following the
// event stream from a snapshot's cursor (a new snapshot when the cursor
// expires). It ends on SIGINT/SIGTERM (exit 0) or when the deployment is
// deleted (exit 0).
func (c *Meta) watchDeployment(cl *client.Client, name string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	last := ""
	show := func(st *wire.DeploymentStatus, ev *wire.Event) {
		key := st.State + fmt.Sprint(st.ReadyN, st.Revision)
		for _, in := range st.Instances {
			key += in.State
		}
		if key == last {
			return
		}
		first := last == ""
		last = key
		switch {
		case c.JSON():
			c.PrintJSON(st)
		case first:
			c.printStatus(st)
			fmt.Fprintln(c.Out)
		default:
			why := ""
			if ev != nil {
				why = " (" + ev.Kind
				if ev.Instance != "" {
					why += " " + ev.Instance
				}
				why += ")"
			}
			fmt.Fprintf(c.Out, "%s  %s: %s, %d/%d ready, revision %d%s\n",
				time.Now().Format("15:04:05"), name, st.State, st.ReadyN, len(st.Instances), st.Revision, why)
		}
	}
	for {
		snap, err := cl.Snapshot(ctx)
		if err != nil {
			return c.watchEnd(ctx, err)
		}
		st, err := cl.Deployment(ctx, name)
		if err != nil {
			return c.watchEnd(ctx, err)
		}
		show(st, nil)
		err = cl.Follow(ctx, snap.Cursor, func(ev *wire.Event) error {
			if ev.Deployment != name {
				return nil
			}
			if ev.Kind == "deployment_deleted" {
				return errDeleted
			}
			st, err := cl.Deployment(ctx, name)
			if err != nil {
				return err
			}
			show(st, ev)
			return nil
		})
		if client.IsCursorExpired(err) {
			continue
		}
		if errors.Is(err, errDeleted) {
			if c.JSON() {
				c.PrintJSON(map[string]any{"name": name, "deleted": true})
			} else {
				fmt.Fprintf(c.Out, "%s  %s: deleted\n", time.Now().Format("15:04:05"), name)
			}
			return 0
		}
		return c.watchEnd(ctx, err)
	}
}

// watchEnd maps the end of a watch to an exit code: an interrupt is 0.
func (c *Meta) watchEnd(ctx context.Context, err error) int {
	if ctx.Err() != nil {
		return 0
	}
	return c.Fail(err)
}

// parkTierNote says what a park tier keeps, with the driver's word.
func parkTierNote(tier, detail string) string {
	note := " (weights dropped: a wake reloads them from disk)"
	if tier == structs.ResidencyHostBacked {
		note = " (weights kept in host RAM: a wake copies them back)"
	}
	if detail != "" {
		note += "; " + detail
	}
	return note
}

// timingsLine renders an instance's measured step durations.
func timingsLine(t *structs.Timings) string {
	var parts []string
	d := func(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
	if t.StartMs > 0 {
		parts = append(parts, "start "+d(t.StartMs))
	}
	tiers := make([]string, 0, len(t.WakeMs))
	for tier := range t.WakeMs {
		tiers = append(tiers, tier)
	}
	sort.Strings(tiers)
	for _, tier := range tiers {
		parts = append(parts, "wake from "+tier+" "+d(t.WakeMs[tier]))
	}
	if t.ParkMs > 0 {
		parts = append(parts, "park "+d(t.ParkMs))
	}
	if t.StopMs > 0 {
		parts = append(parts, "stop "+d(t.StopMs))
	}
	if len(parts) == 0 {
		return "nothing yet"
	}
	return strings.Join(parts, ", ")
}
