// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
)

// ValidateConfigCommand validates a job spec offline.
type ValidateConfigCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *ValidateConfigCommand) Synopsis() string {
	return "Validate a job spec offline and print it completed"
}

// Help implements cli.Command.
func (c *ValidateConfigCommand) Help() string {
	return `Usage: capyctl validate config --file <spec.hcl> [--json]

  Parses and validates a job spec without a running role, then prints each
  deployment completed with defaults: every field, its value, and where
  the value came from (file or default). A malformed file is refused with
  file:line:col (exit 2). What needs a host (the engine registered, its
  flag policy, memory) is checked when the deployment is written.
  Environment values that look like secrets print as <redacted>.

Validate Options:

  --file FILE       The job spec (HCL, or HCL's JSON syntax for .json).

` + GeneralOptions
}

// Run implements cli.Command.
func (c *ValidateConfigCommand) Run(args []string) int {
	fs := c.FlagSet("validate config")
	var file string
	fs.StringVar(&file, "file", "", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return helpOr(code)
	}
	if file == "" && len(rest) == 1 {
		file = rest[0]
	}
	if file == "" {
		return c.Usage("validate config needs --file <spec.hcl>")
	}
	specs, err := jobspec.ParseFile(file)
	if err != nil {
		return c.Fail(err)
	}
	for i, d := range specs {
		red := d.Redacted()
		specs[i] = &red
	}
	if c.JSON() {
		c.PrintJSON(specs)
		return 0
	}
	for i, d := range specs {
		if i > 0 {
			fmt.Fprintln(c.Out)
		}
		fmt.Fprintf(c.Out, "deployment %q: valid (%s)\n\n", d.Name, d.Source)
		values := fieldValues(d)
		keys := make([]string, 0, len(d.Provenance))
		for k := range d.Provenance {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		rows := [][]string{}
		for _, k := range keys {
			rows = append(rows, []string{k, valueAt(values, k), d.Provenance[k]})
		}
		c.Table([]string{"FIELD", "VALUE", "SOURCE"}, rows)
	}
	return 0
}

// fieldValues flattens a deployment's JSON form to field paths.
func fieldValues(d *structs.Deployment) map[string]string {
	data, _ := json.Marshal(d)
	var tree map[string]any
	_ = json.Unmarshal(data, &tree)
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch t := v.(type) {
		case map[string]any:
			if prefix != "" && (prefix == "engine_config.env" || strings.HasPrefix(prefix, "resources")) {
				out[prefix] = compactJSON(t)
				if prefix != "resources" {
					return
				}
			}
			for k, sub := range t {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, sub)
			}
		default:
			out[prefix] = strings.Trim(compactJSON(t), `"`)
		}
	}
	walk("", tree)
	return out
}

// valueAt returns a field's value, or "-" when it is unset (the engine's
// or the driver's own default applies).
func valueAt(values map[string]string, path string) string {
	if v, ok := values[path]; ok && v != "" && v != "null" {
		return v
	}
	return "-"
}

// compactJSON renders v on one line without HTML escaping.
func compactJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSpace(b.String())
}
