// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
)

// APIKeyCreateCommand makes a named key of the inference API.
type APIKeyCreateCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *APIKeyCreateCommand) Synopsis() string {
	return "Make a named inference API key, scoped to models, with limits"
}

// apiKeyOptions is the help text of the options create and update share.
const apiKeyOptions = `Key Options:

  --models LIST         The models the key may use: names and globs,
                        comma-separated ('*' matches any run of characters,
                        slashes included; '?' one character). Any other
                        model is answered 404 unknown_model, exactly as one
                        that does not exist, and /v1/models lists only
                        these. Default: every model.
  --rpm N               Requests per minute (a bucket of N refilled over a
                        minute); over it, 429 rate_limited with Retry-After.
  --tpm N               Tokens per minute (prompt and completion, as the
                        engines report them in each answer); a request is
                        refused while the key is over it.
  --concurrency N       Requests of the key running at once.
  --monthly-tokens N    A token budget per calendar month (UTC); past it,
                        429 quota_exceeded until the next month.
  --weight N            The key's share of a model's places when requests
                        wait for them (weighted fair queuing; 1..1000,
                        default 1).
  --expires DURATION    The key stops working this long from now (720h,
                        30m); its requests are then 401.

  A limit of 0 is no limit. Every answer to a key with a requests or
  tokens limit carries x-ratelimit-limit-*, x-ratelimit-remaining-* and
  x-ratelimit-reset-* headers (requests and tokens), as OpenAI's API does.
`

// Help implements cli.Command.
func (c *APIKeyCreateCommand) Help() string {
	return `Usage: capyctl create api-key NAME [--models LIST] [--rpm N] [--tpm N] [--concurrency N] [--monthly-tokens N] [--weight N] [--expires DURATION] [--json]

  Makes a named key of the inference API and prints it once: the role
  keeps only its digest, so nobody can show it again (revoke it and make
  another when it is lost). Clients send it as Authorization: Bearer <key>
  or x-api-key: <key>. NAME (letters, digits, '-', '_', '.') names the
  key in capyctl list api-keys, capyctl usage, the metrics and the events.

  For a script, take the key from the JSON, which holds only the name and
  the key: capyctl create api-key bob --json | jq -r .key

  The role's own key (the credentials file's api_key) is the key named
  default, allowed every model, until you revoke it.

` + apiKeyOptions + `
` + GeneralOptions
}

// keyFlags are the flags create and update share; set reports which were
// given.
type keyFlags struct {
	models                                 string
	rpm, tpm, concurrency, monthly, weight int64
	expires                                string
}

func (k *keyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.models, "models", "", "")
	fs.Int64Var(&k.rpm, "rpm", 0, "")
	fs.Int64Var(&k.tpm, "tpm", 0, "")
	fs.Int64Var(&k.concurrency, "concurrency", 0, "")
	fs.Int64Var(&k.monthly, "monthly-tokens", 0, "")
	fs.Int64Var(&k.weight, "weight", 0, "")
	fs.StringVar(&k.expires, "expires", "", "")
}

// modelList splits --models.
func modelList(s string) []string {
	out := []string{}
	for _, m := range strings.Split(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// Run implements cli.Command.
func (c *APIKeyCreateCommand) Run(args []string) int {
	fs := c.FlagSet("create api-key")
	var k keyFlags
	k.register(fs)
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 1 {
		return c.Usage("usage: capyctl create api-key NAME [--models LIST] [--rpm N] [--tpm N] [--concurrency N] [--monthly-tokens N] [--weight N] [--expires DURATION]")
	}
	req := wire.APIKeyCreateRequest{Name: rest[0], Models: modelList(k.models), Weight: int(k.weight), Expires: k.expires,
		Limits: wire.APIKeyLimits{RPM: k.rpm, TPM: k.tpm, Concurrency: k.concurrency, MonthlyTokens: k.monthly}}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	out, err := cl.CreateAPIKey(c.ctx(), req)
	if err != nil {
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(struct {
			Name string `json:"name"`
			Key  string `json:"key"`
		}{out.Name, out.Key})
		return 0
	}
	fmt.Fprintf(c.Out, "API key %s (shown once; the role keeps only its digest):\n\n  %s\n\n", out.Name, out.Key)
	c.describeKey(&out.APIKey)
	fmt.Fprintf(c.Out, "\nSend it as Authorization: Bearer <key> (or x-api-key: <key>).\n")
	return 0
}

// describeKey prints a key's scope, limits and expiry.
func (c *Meta) describeKey(k *wire.APIKey) {
	models := "every model"
	if len(k.Models) > 0 {
		models = strings.Join(k.Models, ", ")
	}
	fmt.Fprintf(c.Out, "Models:   %s\n", models)
	fmt.Fprintf(c.Out, "Limits:   %s\n", limitsText(k.Limits))
	fmt.Fprintf(c.Out, "Weight:   %d\n", k.Weight)
	exp := "never"
	if !k.ExpiresAt.IsZero() {
		exp = k.ExpiresAt.UTC().Format(time.RFC3339) + " (" + until(k.ExpiresAt, c.now()) + ")"
	}
	fmt.Fprintf(c.Out, "Expires:  %s\n", exp)
}

// limitsText says a key's limits in words ("none" without any).
func limitsText(l wire.APIKeyLimits) string {
	var parts []string
	add := func(n int64, what string) {
		if n > 0 {
			parts = append(parts, strconv.FormatInt(n, 10)+" "+what)
		}
	}
	add(l.RPM, "requests/min")
	add(l.TPM, "tokens/min")
	add(l.Concurrency, "at once")
	add(l.MonthlyTokens, "tokens/month")
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
