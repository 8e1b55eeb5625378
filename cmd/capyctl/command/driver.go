// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"github.com/capyctl/capyctl/core/version"
	"github.com/capyctl/capyctl/drivers/custom"
	"github.com/capyctl/capyctl/drivers/llamacpp"
	"github.com/capyctl/capyctl/drivers/sglang"
	"github.com/capyctl/capyctl/drivers/tensorfold"
	"github.com/capyctl/capyctl/drivers/vllm"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/plugin"
)

// builtinDrivers are the first-party drivers compiled into capyctl, each
// stamped with this build's version (a driver does not import the core).
var builtinDrivers = map[string]func() sdk.Driver{
	"custom":     func() sdk.Driver { d := custom.New(); d.Version = version.Version; return d },
	"llamacpp":   func() sdk.Driver { d := llamacpp.New(); d.Version = version.Version; return d },
	"tensorfold": func() sdk.Driver { d := tensorfold.New(); d.Version = version.Version; return d },
	"vllm":       func() sdk.Driver { d := vllm.New(); d.Version = version.Version; return d },
	"sglang":     func() sdk.Driver { d := sglang.New(); d.Version = version.Version; return d },
}

// DriverCommand serves a built-in driver over go-plugin. The core runs it
// (`capyctl driver <family>`); it is hidden from help.
type DriverCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *DriverCommand) Synopsis() string { return "Serve a built-in engine driver (run by the core)" }

// Help implements cli.Command.
func (c *DriverCommand) Help() string {
	return "Usage: capyctl driver <family>\n\n  Serves a built-in driver over go-plugin. The core runs this; people do not.\n"
}

// Run implements cli.Command.
func (c *DriverCommand) Run(args []string) int {
	if len(args) != 1 {
		return c.Usage("usage: capyctl driver <family>")
	}
	mk, ok := builtinDrivers[args[0]]
	if !ok {
		return c.Usage("no built-in driver %q", args[0])
	}
	plugin.Serve(mk())
	return 0
}
