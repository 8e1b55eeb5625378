// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/mitchellh/cli"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// ExitCodesCommand prints the exit codes and the error codes behind them.
type ExitCodesCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ExitCodesCommand) Synopsis() string {
	return "Print the exit codes and the error codes behind each"
}

// Help implements cli.Command.
func (c *ExitCodesCommand) Help() string {
	return `Usage: capyctl help exit-codes [--json]

  Prints every exit code capyctl returns and the error codes behind each,
  from the one catalogue the API also answers with (the code, the HTTP
  status, whether a client may retry). An error prints
  "error [<code>]: <message>" on stderr, or a JSON object with --json.

` + GeneralOptions
}

// ExitCodeRow is one exit code and the error codes that end with it.
type ExitCodeRow struct {
	Exit    int            `json:"exit"`
	Meaning string         `json:"meaning"`
	Codes   []wire.CodeRow `json:"codes"`
}

// exitMeanings name what each exit code means as a whole.
var exitMeanings = map[int]string{
	0:  "success",
	1:  "a confirmation was declined",
	2:  "invalid input: a request, a job spec or a configuration (fix it; do not retry as is)",
	3:  "unauthorized: a missing or wrong API key or admin token",
	4:  "no room: memory or waiting places (retry later, or make room)",
	5:  "unsupported: the action, the engine or the machine cannot do this",
	10: "a start did not become ready in time",
	13: "a launch, a wake or the engine failed (the reason and the engine's last lines are printed)",
	16: "the engine is not found",
	17: "the engine installation is not one CapyCTL can run, or it changed since it was pinned",
	18: "the engine's version could not be read",
	19: "an engine with this name is registered",
	20: "a deployment uses this engine",
	22: "no running role was found through the state directory",
	23: "a confirmation is needed and there is no terminal (pass --yes)",
	25: "a previous stop is still in progress",
	26: "build tools the engine needs are missing",
	27: "the state store cannot be written (a full disk, a read-only file); nothing was left running",
	28: "this server is not the leader of the server cluster; the leader is named (retry there, or once one is elected)",
	29: "an address the role listens on is taken by another process (retry once it is free, or choose another with --listen, --management-listen or --cluster-listen); the systemd units restart on it",
}

// ExitCodes returns the exit-code table built from the catalogue (wire.Catalogue).
func ExitCodes() []ExitCodeRow {
	byExit := map[int]*ExitCodeRow{}
	for e, m := range exitMeanings {
		byExit[e] = &ExitCodeRow{Exit: e, Meaning: m, Codes: []wire.CodeRow{}}
	}
	for _, info := range wire.Catalogue() {
		r := byExit[info.Exit]
		if r == nil {
			r = &ExitCodeRow{Exit: info.Exit, Meaning: info.Summary, Codes: []wire.CodeRow{}}
			byExit[info.Exit] = r
		}
		if info.Code != structs.CodeOK {
			r.Codes = append(r.Codes, info)
		}
	}
	out := make([]ExitCodeRow, 0, len(byExit))
	for _, r := range byExit {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Exit < out[j].Exit })
	return out
}

// Run implements cli.Command.
func (c *ExitCodesCommand) Run(args []string) int {
	fs := c.FlagSet("help exit-codes")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl help exit-codes")
	}
	rows := ExitCodes()
	if c.JSON() {
		c.PrintJSON(rows)
		return 0
	}
	tw := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', 0)
	for i, r := range rows {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "Exit %d: %s\n", r.Exit, r.Meaning)
		for _, info := range r.Codes {
			retry := "no"
			if info.Retryable {
				retry = "yes"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\n", info.Code, info.HTTP, retry, info.Summary)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(c.Out, "\nColumns: error code, HTTP status of the API answer, whether a client may retry it as is, summary.")
	return 0
}

// HelpCommand is `capyctl help [topic]`.
type HelpCommand struct {
	*Meta
	commands func() map[string]cli.CommandFactory
}

// Synopsis implements cli.Command.
func (c *HelpCommand) Synopsis() string { return "Print help; help exit-codes prints the exit codes" }

// Help implements cli.Command.
func (c *HelpCommand) Help() string {
	return "Usage: capyctl help [exit-codes]\n\n  Prints the commands, or the exit codes with help exit-codes.\n  capyctl <command> --help prints a command's options.\n"
}

// Run implements cli.Command.
func (c *HelpCommand) Run(args []string) int {
	if len(args) != 0 {
		return c.Usage("no help topic %q: capyctl help exit-codes, or capyctl %s --help", strings.Join(args, " "), strings.Join(args, " "))
	}
	fmt.Fprint(c.Out, helpFunc(c.commands()))
	return 0
}
