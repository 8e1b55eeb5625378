// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"flag"
	"fmt"

	"github.com/capyctl/capyctl/core/api/wire"
)

// APIKeyUpdateCommand changes a named key's scope, limits, weight or
// expiry.
type APIKeyUpdateCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *APIKeyUpdateCommand) Synopsis() string {
	return "Change a named API key's models, limits, weight or expiry"
}

// Help implements cli.Command.
func (c *APIKeyUpdateCommand) Help() string {
	return `Usage: capyctl update api-key NAME [--models LIST] [--rpm N] [--tpm N] [--concurrency N] [--monthly-tokens N] [--weight N] [--expires DURATION|never] [--json]

  Changes what the options given say and leaves the rest of the key as
  it is; the key itself does not change. The next request with the key
  sees the change. --models "" allows every model again; a limit of 0
  removes it; --expires never removes the expiry. Prints the key's record
  after the change.

` + apiKeyOptions + `
` + GeneralOptions
}

// Run implements cli.Command.
func (c *APIKeyUpdateCommand) Run(args []string) int {
	fs := c.FlagSet("update api-key")
	var k keyFlags
	k.register(fs)
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl update api-key NAME [--models LIST] [--rpm N] [--tpm N] [--concurrency N] [--monthly-tokens N] [--weight N] [--expires DURATION|never]")
	}
	var req wire.APIKeyUpdateRequest
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "models":
			m := modelList(k.models)
			req.Models = &m
		case "rpm":
			req.RPM = &k.rpm
		case "tpm":
			req.TPM = &k.tpm
		case "concurrency":
			req.Concurrency = &k.concurrency
		case "monthly-tokens":
			req.MonthlyTokens = &k.monthly
		case "weight":
			w := int(k.weight)
			req.Weight = &w
		case "expires":
			req.Expires = &k.expires
		}
	})
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	out, err := cl.UpdateAPIKey(c.ctx(), rest[0], req)
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(out)
		return 0
	}
	fmt.Fprintf(c.Out, "API key %s updated.\n\n", out.Name)
	c.describeKey(out)
	return 0
}
