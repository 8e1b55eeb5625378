// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"strconv"
	"strings"
	"time"
)

// APIKeyListCommand lists the named keys.
type APIKeyListCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *APIKeyListCommand) Synopsis() string { return "List the named API keys (never a key itself)" }

// Help implements cli.Command.
func (c *APIKeyListCommand) Help() string {
	return `Usage: capyctl list api-keys [--json]

  Lists the inference API's named keys, one row each; never a key itself
  (the role keeps only digests):

    NAME       the key's name; default is the role's own key
    PREFIX     how the key begins (its public identifier), to tell keys apart
    MODELS     the names and globs it may use (* : every model)
    LIMITS     requests and tokens per minute, at once, tokens per month
    WEIGHT     its share of a contended model's places
    CREATED    when it was made
    LAST USED  its last authenticated request on this role (- : never)
    EXPIRES    when it stops working (never, or expired)

` + GeneralOptions
}

// Run implements cli.Command.
func (c *APIKeyListCommand) Run(args []string) int {
	fs := c.FlagSet("list api-keys")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl list api-keys")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	keys, err := cl.APIKeys(c.ctx())
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(keys)
		return 0
	}
	now := c.now()
	rows := [][]string{}
	for _, k := range keys {
		models := "*"
		if len(k.Models) > 0 {
			models = strings.Join(k.Models, ",")
		}
		last := "-"
		if !k.LastUsedAt.IsZero() {
			last = ago(k.LastUsedAt, now)
		}
		exp := "never"
		if !k.ExpiresAt.IsZero() {
			exp = until(k.ExpiresAt, now)
		}
		prefix := orDash(k.Prefix)
		if k.Role {
			prefix = "(credentials file)"
		}
		rows = append(rows, []string{k.Name, prefix, models, limitsText(k.Limits), strconv.Itoa(k.Weight),
			k.CreatedAt.UTC().Format(time.DateTime), last, exp})
	}
	c.Table([]string{"NAME", "PREFIX", "MODELS", "LIMITS", "WEIGHT", "CREATED", "LAST USED", "EXPIRES"}, rows)
	return 0
}
