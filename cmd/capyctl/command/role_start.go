// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"

	"github.com/capyctl/capyctl/core/structs"
)

// RoleStartCommand is `start server` and `start host`: the roles of a
// CapyCTL spread over several machines. This release runs one machine
// (standalone); these commands check their configuration and then refuse
// with a code (unsupported, exit 5, which systemd does not restart).
type RoleStartCommand struct {
	*Meta
	role string
}

// Synopsis implements cli.Command.
func (c *RoleStartCommand) Synopsis() string {
	return fmt.Sprintf("Run the %s role (several machines: not in this release)", c.role)
}

// Help implements cli.Command.
func (c *RoleStartCommand) Help() string {
	return fmt.Sprintf(`Usage: capyctl start %s [--config FILE] [options]

  The %s role belongs to a CapyCTL spread over several machines (a server
  that routes, hosts that run engines). This release runs on one machine:
  use capyctl start standalone on each GPU machine. The command reads and
  checks its configuration (exit 2 when it is invalid), then refuses with
  unsupported (exit 5).

  It takes the same options as capyctl start standalone.

`, c.role, c.role) + GeneralOptions
}

// Run implements cli.Command.
func (c *RoleStartCommand) Run(args []string) int {
	cfg, _, code := c.loadRoleConfig("start "+c.role, c.role, args)
	if cfg == nil {
		return code
	}
	return c.Fail(structs.Errf(structs.CodeUnsupported,
		"the %s role (CapyCTL on several machines) is not in this release; run capyctl start standalone on each GPU machine", c.role).
		WithDetail("role", c.role))
}
