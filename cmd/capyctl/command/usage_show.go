// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"encoding/csv"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
)

// UsageCommand shows what the API keys used.
type UsageCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *UsageCommand) Synopsis() string {
	return "Show the API keys' usage: requests, errors and tokens per key, model and hour"
}

// Help implements cli.Command.
func (c *UsageCommand) Help() string {
	return `Usage: capyctl usage [--key NAME] [--model M] [--since DURATION] [--hourly] [--json|--csv]

  Shows what each API key used, per model: requests (refused ones
  included), errors by code, prompt, completion and cached tokens as the
  engines reported them in their answers (never an estimate), and the
  requests' total time. The role counts per key, model and hour (UTC) and
  keeps the counts for usage.retention (90 days by default); in a cluster
  of servers, each server counts the requests it took and this command
  sums every server's.

  Requests refused before their model was read (over a limit, a key
  outside its models) count under the model "-".

Usage Options:

  --key NAME        One key only.
  --model M         One model only (the name the requests asked for).
  --since DURATION  From this long ago (24h, 7d, 90d; default 24h), or an
                    RFC 3339 time; counts start on the hour.
  --hourly          One row per hour instead of one per key and model.
  --csv             CSV, one row per key, model and hour: hour, key, model,
                    requests, errors (code=n;...), prompt_tokens,
                    completion_tokens, cached_tokens, request_ms.
  --json            The rows per hour and the totals per key and model:
                    {"since", "rows": [...], "totals": [...]}.

` + GeneralOptions
}

// usageOutput is capyctl usage --json.
type usageOutput struct {
	Since   time.Time       `json:"since"`
	Rows    []wire.UsageRow `json:"rows"`
	Totals  []wire.UsageRow `json:"totals"`
	Servers []string        `json:"servers,omitempty"`
	Missing []string        `json:"missing,omitempty"`
}

// Run implements cli.Command.
func (c *UsageCommand) Run(args []string) int {
	fs := c.FlagSet("usage")
	var q client.UsageQuery
	var hourly, csvOut bool
	fs.StringVar(&q.Key, "key", "", "")
	fs.StringVar(&q.Model, "model", "", "")
	fs.StringVar(&q.Since, "since", "", "")
	fs.BoolVar(&hourly, "hourly", false, "")
	fs.BoolVar(&csvOut, "csv", false, "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if len(rest) != 0 {
		return c.Usage("usage: capyctl usage [--key NAME] [--model M] [--since DURATION] [--hourly] [--json|--csv]")
	}
	if csvOut && c.JSON() {
		return c.Usage("--csv and --json: pick one")
	}
	cl, err := c.Client()
	if err != nil {
		return c.Fail(err)
	}
	res, err := cl.Usage(c.ctx(), q)
	if err != nil {
		return c.Fail(err)
	}
	totals := usageTotals(res.Rows)
	switch {
	case c.JSON():
		c.PrintJSON(usageOutput{Since: res.Since, Rows: nonNilRows(res.Rows), Totals: nonNilRows(totals), Servers: res.Servers, Missing: res.Missing})
		return 0
	case csvOut:
		w := csv.NewWriter(c.Out)
		_ = w.Write([]string{"hour", "key", "model", "requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "request_ms"})
		for _, r := range res.Rows {
			_ = w.Write([]string{r.Hour.UTC().Format(time.RFC3339), r.Key, r.Model, itoa(r.Requests), errorsText(r.Errors, "=", ";"),
				itoa(r.PromptTokens), itoa(r.CompletionTokens), itoa(r.CachedTokens), itoa(r.RequestMs)})
		}
		w.Flush()
		return 0
	}
	rows := totals
	header := []string{"KEY", "MODEL", "REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "CACHED", "TIME"}
	if hourly {
		rows = res.Rows
		header = append([]string{"HOUR"}, header...)
	}
	out := [][]string{}
	for _, r := range rows {
		row := []string{r.Key, orDash(r.Model), itoa(r.Requests), orDash(errorsText(r.Errors, " ", ", ")), itoa(r.PromptTokens),
			itoa(r.CompletionTokens), itoa(r.CachedTokens), requestTime(r.RequestMs)}
		if hourly {
			row = append([]string{r.Hour.UTC().Format("2006-01-02 15:04")}, row...)
		}
		out = append(out, row)
	}
	c.Table(header, out)
	fmt.Fprintf(c.Out, "\nSince %s (UTC).", res.Since.UTC().Format("2006-01-02 15:04"))
	if len(res.Missing) > 0 {
		fmt.Fprintf(c.Out, " Missing the counts of %s (no answer).", strings.Join(res.Missing, ", "))
	}
	fmt.Fprintln(c.Out)
	return 0
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// requestTime writes the requests' total time: milliseconds under a
// second, else as shortDuration does.
func requestTime(ms int64) string {
	if ms < 1000 {
		return itoa(ms) + "ms"
	}
	return shortDuration(time.Duration(ms) * time.Millisecond)
}

// errorsText writes errors by code ("rate_limited 3, unknown_model 1").
func errorsText(errs map[string]int64, sep, join string) string {
	codes := make([]string, 0, len(errs))
	for c := range errs {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	parts := make([]string, 0, len(codes))
	for _, c := range codes {
		parts = append(parts, c+sep+itoa(errs[c]))
	}
	return strings.Join(parts, join)
}

// usageTotals sums hourly rows per key and model.
func usageTotals(rows []wire.UsageRow) []wire.UsageRow {
	type km struct{ key, model string }
	sum := map[km]*wire.UsageRow{}
	var order []km
	for _, r := range rows {
		k := km{r.Key, r.Model}
		t := sum[k]
		if t == nil {
			t = &wire.UsageRow{Key: r.Key, Model: r.Model}
			sum[k] = t
			order = append(order, k)
		}
		t.Requests += r.Requests
		t.PromptTokens += r.PromptTokens
		t.CompletionTokens += r.CompletionTokens
		t.CachedTokens += r.CachedTokens
		t.RequestMs += r.RequestMs
		for code, n := range r.Errors {
			if t.Errors == nil {
				t.Errors = map[string]int64{}
			}
			t.Errors[code] += n
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].key != order[j].key {
			return order[i].key < order[j].key
		}
		return order[i].model < order[j].model
	})
	out := make([]wire.UsageRow, 0, len(order))
	for _, k := range order {
		out = append(out, *sum[k])
	}
	return out
}

func nonNilRows(r []wire.UsageRow) []wire.UsageRow {
	if r == nil {
		return []wire.UsageRow{}
	}
	return r
}
