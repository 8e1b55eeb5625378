// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"sort"

	"github.com/capyctl/capyctl/core/jobspec"
)

// ValidateConfigCommand validates a job spec offline.
type ValidateConfigCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ValidateConfigCommand) Synopsis() string {
	return "Validate a job spec offline and print it completed"
}

// Help implements cli.Command.
func (c *ValidateConfigCommand) Help() string {
	return `Usage: capyctl validate config --file <spec.hcl> [--json]

  Parses and validates a job spec without a running role, then prints each
  deployment completed with defaults, and where each value came from (file
  or default). A malformed file is refused with file:line:col (exit 2).
  What needs a host (the engine registered, its flag policy, memory) is
  checked when the deployment is written.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *ValidateConfigCommand) Run(args []string) int {
	fs := c.FlagSet("validate config")
	var file string
	fs.StringVar(&file, "file", "", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if file == "" && len(rest) == 1 {
		file = rest[0]
	}
	if file == "" {
		return c.Usage("validate config needs --file <spec.hcl>")
	}
	specs, err := jobspec.ParseFile(file)
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(specs)
		return 0
	}
	for _, d := range specs {
		fmt.Fprintf(c.Out, "deployment %q: valid\n", d.Name)
		keys := make([]string, 0, len(d.Provenance))
		for k := range d.Provenance {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(c.Out, "  %-40s %s\n", k, d.Provenance[k])
		}
	}
	return 0
}
