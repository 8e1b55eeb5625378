// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
)

// ConfigShowCommand prints every role setting, its value and its source.
type ConfigShowCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ConfigShowCommand) Synopsis() string {
	return "Print every role setting, its value and where it came from"
}

// Help implements cli.Command.
func (c *ConfigShowCommand) Help() string {
	return `Usage: capyctl config show [--role ROLE] [--config FILE] [role options] [--json]
       capyctl config show --running [--json]

  Resolves the role configuration the way capyctl start <role> would, with
  the same options, environment and file, and prints every setting with
  its value and its source:

    flag     a named option (--listen) or --set PATH=VALUE
    env      an environment variable (CAPYCTL_LISTEN)
    file     the configuration file (file:line)
    default  the built-in default

  A flag wins over the environment, which wins over the file, which wins
  over the default. Nothing needs to run. With --running, the running
  role's own configuration is fetched from its management API (secrets
  redacted).

Show Options:

  --role ROLE       standalone, server or host (default: the file's role,
                    CAPYCTL_ROLE, else standalone).
  --running         Show the configuration of the role running with the
                    state directory.
  --config FILE     Role configuration (HCL); env CAPYCTL_CONFIG.
  --set PATH=VALUE  Any setting by its path (repeatable), as a flag.
  The named options of capyctl start standalone (--listen, ...) are taken.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *ConfigShowCommand) Run(args []string) int {
	fs := c.FlagSet("config show")
	o := addRoleFlags(fs)
	var role string
	var running bool
	fs.StringVar(&role, "role", "", "")
	fs.BoolVar(&running, "running", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl config show [--role ROLE] [options]")
	}
	var rc *wire.RoleConfig
	if running {
		cl, err := c.Client()
		if err != nil {
			return c.Fail(err)
		}
		rc, err = cl.RoleConfig(c.ctx())
		if err != nil {
			return c.Fail(err)
		}
	} else {
		cfg, file, err := c.loadConfig(o, role)
		if err != nil {
			return c.Fail(err)
		}
		rc = roleConfigOf(cfg, file)
	}
	if c.JSON() {
		c.PrintJSON(rc)
		return 0
	}
	file := rc.File
	if file == "" {
		file = "none"
	}
	fmt.Fprintf(c.Out, "Role:   %s\nConfig: %s\n\n", rc.Role, file)
	rows := [][]string{}
	for _, s := range rc.Settings {
		rows = append(rows, []string{s.Path, showValue(s.Value), source(s)})
	}
	c.Table([]string{"SETTING", "VALUE", "SOURCE"}, rows)
	return 0
}

func showValue(v string) string {
	if v == "" {
		return `""`
	}
	return v
}

// source renders where a value came from: "env CAPYCTL_LISTEN", "flag
// listen", "file role.hcl:12", "default" or "default (how it was derived)".
func source(s wire.ConfigSetting) string {
	switch {
	case s.Detail == "":
		return s.From
	case strings.HasPrefix(s.Detail, s.From+" "):
		return s.Detail
	case s.From == "default":
		return "default (" + s.Detail + ")"
	}
	return s.From + " " + s.Detail
}
