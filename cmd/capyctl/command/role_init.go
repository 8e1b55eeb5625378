// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"bytes"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"

	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/structs"
)

// RoleInitCommand writes a commented role configuration.
type RoleInitCommand struct {
	*Meta
	role string
}

// Synopsis implements cli.Command.
func (c *RoleInitCommand) Synopsis() string {
	return fmt.Sprintf("Write a commented %s role configuration (HCL)", c.role)
}

// Help implements cli.Command.
func (c *RoleInitCommand) Help() string {
	return fmt.Sprintf(`Usage: capyctl init %s [--output FILE] [--force]

  Writes the %s role's configuration: every setting that matters to the
  role, commented out with its default, its environment variable and a
  one-line description. Uncomment a line to change a value. Without
  --output the file is printed.

Init Options:

  --output FILE     Write the configuration to FILE (created 0600).
  --force           Replace FILE if it exists.

`, c.role, c.role) + GeneralOptions
}

// Run implements cli.Command.
func (c *RoleInitCommand) Run(args []string) int {
	fs := c.FlagSet("init " + c.role)
	var output string
	var force bool
	fs.StringVar(&output, "output", "", "")
	fs.BoolVar(&force, "force", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl init %s [--output FILE]", c.role)
	}
	var buf bytes.Buffer
	if err := config.WriteDefault(c.role, &buf); err != nil {
		return c.Fail(structs.Wrap(structs.CodeInternal, err, "write the configuration"))
	}
	if output == "" {
		if c.JSON() {
			c.PrintJSON(map[string]string{"role": c.role, "config": buf.String()})
			return 0
		}
		_, _ = c.Out.Write(buf.Bytes())
		return 0
	}
	if _, err := os.Stat(output); err == nil && !force {
		return c.Fail(structs.Errf(structs.CodeConflict, "%s exists: pass --force to replace it", output))
	} else if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return c.Fail(structs.Errf(structs.CodeInvalidRequest, "%s: %v", output, err))
	}
	if dir := filepath.Dir(output); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return c.Fail(structs.Errf(structs.CodeInvalidRequest, "create %s: %v", dir, err))
		}
	}
	if err := os.WriteFile(output, buf.Bytes(), 0o600); err != nil {
		return c.Fail(structs.Errf(structs.CodeInvalidRequest, "write %s: %v", output, err))
	}
	abs, _ := filepath.Abs(output)
	if c.JSON() {
		c.PrintJSON(map[string]string{"role": c.role, "path": abs})
		return 0
	}
	fmt.Fprintf(c.Out, "Wrote the %s configuration to %s\n", c.role, abs)
	fmt.Fprintf(c.Out, "Start the role with: capyctl start %s --config %s\n", c.role, abs)
	return 0
}
