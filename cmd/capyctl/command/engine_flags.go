// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/flags"
)

// EngineFlagsCommand prints a family's flag policy.
type EngineFlagsCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *EngineFlagsCommand) Synopsis() string {
	return "Print which engine options CapyCTL owns, reserves, gates or passes"
}

// Help implements cli.Command.
func (c *EngineFlagsCommand) Help() string {
	return `Usage: capyctl engine flags <family> [--format json]

  Prints the flag-policy table of an engine family: every option and
  environment name CapyCTL owns (renders itself), reserves (refused in any
  spelling), gates behind a host approval, or passes unchanged, and why.

  A running role answers through its driver (a third-party driver's family
  needs one). Without a running role, the families whose drivers are built
  into capyctl (custom, llamacpp, sglang, tensorfold, vllm) answer from
  the driver compiled into this binary: the same table.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *EngineFlagsCommand) Run(args []string) int {
	fs := c.FlagSet("engine flags")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl engine flags <family>")
	}
	family := rest[0]
	var t *wire.FlagTable
	cl, err := c.Client()
	switch {
	case err == nil:
		t, err = cl.Flags(c.ctx(), family)
	case structs.HasCode(err, structs.CodeRoleNotRunning) && builtinDrivers[family] != nil:
		t, err = builtinFlagTable(c.ctx(), family)
	}
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(t)
		return 0
	}
	rows := [][]string{}
	for _, r := range t.Rules {
		name := r.Name
		if len(r.Aliases) > 0 {
			name += " (" + strings.Join(r.Aliases, ", ") + ")"
		}
		class := r.Class
		if r.Approval != "" {
			class += ":" + r.Approval
		}
		rows = append(rows, []string{name, r.Kind, class, r.Reason})
	}
	c.Table([]string{"NAME", "KIND", "CLASS", "REASON"}, rows)
	return 0
}

// builtinFlagTable asks a built-in driver for its flag policy in process,
// as the role would through the driver's plugin (the same code: the role
// runs this binary as `capyctl driver <family>`), and builds the table the
// management API answers with.
func builtinFlagTable(ctx context.Context, family string) (*wire.FlagTable, error) {
	resp, err := builtinDrivers[family]().Flags(ctx, &sdk.FlagsRequest{})
	if err != nil {
		if sdk.CodeOf(err) == "" {
			return nil, structs.Wrap(structs.CodeUnsupported, err, "flags of %s", family)
		}
		return nil, &structs.Error{Code: structs.Code(sdk.CodeOf(err)), Message: err.Error(), Cause: err}
	}
	out := &wire.FlagTable{APIVersion: wire.APIVersion, Family: family}
	for _, rule := range resp.Rules {
		out.Rules = append(out.Rules, wire.FlagRule{
			Name: rule.Name, Kind: flags.KindName(rule.Kind), Class: flags.ClassName(rule.Class),
			Reason: rule.Reason, Approval: rule.Approval, Aliases: rule.Aliases,
		})
	}
	return out, nil
}
