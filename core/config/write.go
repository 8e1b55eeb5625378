// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// WriteDefault writes a role configuration for `capyctl init <role>`: the
// role, then every setting that matters to it, commented out with its
// default, its environment variable and a one-line description. Load reads
// it back unchanged.
func WriteDefault(role string, w io.Writer) error {
	if !slices.Contains(Roles, role) {
		return fmt.Errorf("write default configuration: unknown role %q (use %s)", role, strings.Join(Roles, ", "))
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# CapyCTL %s role configuration.\n", role)
	bw.WriteString(`#
# Every setting is listed with its default, commented out: uncomment a line
# to change it. A value can also come from an environment variable (named
# beside each setting) or a flag; a flag wins over the variable, which wins
# over this file. "capyctl config show" prints each value and its source.
`)
	root := grammar()
	writeNode(bw, root, role, "", "")
	return bw.Flush()
}

func writeNode(w *bufio.Writer, n *node, role, prefix, indent string) {
	for _, d := range registry {
		name, ok := strings.CutPrefix(d.Path, prefix)
		if !ok || strings.Contains(name, ".") || !d.AppliesTo(role) {
			continue
		}
		w.WriteString("\n")
		fmt.Fprintf(w, "%s# %s.\n", indent, upperFirst(d.Description))
		if d.defaultText != "" {
			fmt.Fprintf(w, "%s# Default: %s.\n", indent, d.defaultText)
		}
		env := "env " + d.Env
		if len(d.Values) > 0 {
			env += "; one of " + strings.Join(d.Values, ", ")
		}
		fmt.Fprintf(w, "%s# (%s)\n", indent, env)
		if d.Path == "role" {
			fmt.Fprintf(w, "%srole = %q\n", indent, role)
			continue
		}
		example := d.Default
		if d.example != "" {
			example = d.example
		} else if d.computed != nil {
			// A default that depends on the role (listen).
			if v, _ := d.computed(&Config{Role: role}, &loadContext{}); v != "" {
				example = v
			}
		}
		fmt.Fprintf(w, "%s# %s = %s\n", indent, name, literal(d, example))
	}
	// Blocks, in the order their first setting appears in the registry.
	var order []string
	for _, d := range registry {
		rest, ok := strings.CutPrefix(d.Path, prefix)
		if !ok || !strings.Contains(rest, ".") || !d.AppliesTo(role) {
			continue
		}
		b, _, _ := strings.Cut(rest, ".")
		if !slices.Contains(order, b) {
			order = append(order, b)
		}
	}
	for _, b := range order {
		fmt.Fprintf(w, "\n%s%s {", indent, b)
		writeNode(w, n.blocks[b], role, prefix+b+".", indent+"  ")
		fmt.Fprintf(w, "%s}\n", indent)
	}
}

// literal renders a default as HCL.
func literal(d Definition, v string) string {
	switch d.Kind {
	case KindInt, KindBool:
		if v != "" {
			return v
		}
	}
	return strconv.Quote(v)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
