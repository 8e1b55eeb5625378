// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import "fmt"

// APIKeyRevokeCommand revokes a named key.
type APIKeyRevokeCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *APIKeyRevokeCommand) Synopsis() string { return "Revoke a named API key" }

// Help implements cli.Command.
func (c *APIKeyRevokeCommand) Help() string {
	return `Usage: capyctl revoke api-key NAME [--json]

  Revokes a key: its next request is answered 401 (in a cluster of
  servers, on every server within a second). Requests already running
  finish. Its usage stays in capyctl usage. Revoking default turns off the
  role's own key (the credentials file's api_key): make a named key for
  every client first.

` + GeneralOptions
}

// Run implements cli.Command.
func (c *APIKeyRevokeCommand) Run(args []string) int {
	fs := c.FlagSet("revoke api-key")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl revoke api-key NAME")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	if err := cl.RevokeAPIKey(c.ctx(), rest[0]); err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(map[string]string{"revoked": rest[0]})
		return 0
	}
	fmt.Fprintf(c.Out, "API key %s revoked: its next request is answered 401.\n", rest[0])
	return 0
}
