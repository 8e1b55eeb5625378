// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"

	"github.com/capyctl/capyctl/sdk/hclbound"
)

// fileValue is a setting's value in the file and where it was written.
type fileValue struct {
	value string
	where string
}

// node is a level of the file's grammar: attributes and nested blocks,
// derived from the registry's paths.
type node struct {
	attrs  map[string]bool
	blocks map[string]*node
}

func grammar() *node {
	root := &node{attrs: map[string]bool{}, blocks: map[string]*node{}}
	for _, d := range registry {
		n := root
		parts := strings.Split(d.Path, ".")
		for _, p := range parts[:len(parts)-1] {
			child, ok := n.blocks[p]
			if !ok {
				child = &node{attrs: map[string]bool{}, blocks: map[string]*node{}}
				n.blocks[p] = child
			}
			n = child
		}
		n.attrs[parts[len(parts)-1]] = true
	}
	return root
}

func (n *node) schema() *hcl.BodySchema {
	s := &hcl.BodySchema{}
	for _, a := range sortedSet(n.attrs) {
		s.Attributes = append(s.Attributes, hcl.AttributeSchema{Name: a})
	}
	for _, b := range sortedSet(n.blocks) {
		s.Blocks = append(s.Blocks, hcl.BlockHeaderSchema{Type: b})
	}
	return s
}

func sortedSet[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readFile parses a role configuration into setting values.
func readFile(path string) (map[string]fileValue, []Problem) {
	src, err := hclbound.ReadFile(path)
	if err != nil {
		return nil, []Problem{{From: FromFile, Detail: path, Message: "cannot read the configuration file: " + err.Error()}}
	}
	return parseFile(src, path)
}

func parseFile(src []byte, path string) (map[string]fileValue, []Problem) {
	var (
		file  *hcl.File
		diags hcl.Diagnostics
	)
	// IMPORTANT: bound the source before a parser descends into it.
	if diags := hclbound.Check(src, path); diags.HasErrors() {
		return nil, fromDiags(diags)
	}
	if strings.HasSuffix(path, ".json") {
		file, diags = hcljson.Parse(src, path)
	} else {
		file, diags = hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	}
	if diags.HasErrors() {
		return nil, fromDiags(diags)
	}
	out := map[string]fileValue{}
	diags = walk(file.Body, grammar(), "", out)
	if diags.HasErrors() {
		return nil, fromDiags(diags)
	}
	return out, nil
}

func walk(body hcl.Body, n *node, prefix string, out map[string]fileValue) hcl.Diagnostics {
	content, diags := body.Content(n.schema())
	for name, attr := range content.Attributes {
		path := prefix + name
		v, d := attr.Expr.Value(nil)
		diags = append(diags, d...)
		if d.HasErrors() || v.IsNull() {
			continue
		}
		s, err := scalar(v)
		if err != nil {
			r := attr.Expr.Range()
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "invalid " + path, Detail: err.Error(), Subject: &r})
			continue
		}
		out[path] = fileValue{value: s, where: fmt.Sprintf("%s:%d", attr.Range.Filename, attr.Range.Start.Line)}
	}
	seen := map[string]hcl.Range{}
	for _, b := range content.Blocks {
		if prev, ok := seen[b.Type]; ok {
			r := b.DefRange
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "duplicate " + prefix + b.Type + " block",
				Detail: fmt.Sprintf("already declared at %s:%d; merge them", prev.Filename, prev.Start.Line), Subject: &r})
			continue
		}
		seen[b.Type] = b.DefRange
		diags = append(diags, walk(b.Body, n.blocks[b.Type], prefix+b.Type+".", out)...)
	}
	return diags
}

// scalar renders a string, number or bool as the text a flag would carry.
func scalar(v cty.Value) (string, error) {
	if !v.IsWhollyKnown() {
		return "", fmt.Errorf("the value must be a constant")
	}
	switch v.Type() {
	case cty.String:
		return v.AsString(), nil
	case cty.Number:
		return v.AsBigFloat().Text('f', -1), nil
	case cty.Bool:
		if v.True() {
			return "true", nil
		}
		return "false", nil
	}
	return "", fmt.Errorf("a string, number or bool is required, not %s", v.Type().FriendlyName())
}

func fromDiags(diags hcl.Diagnostics) []Problem {
	var out []Problem
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		p := Problem{From: FromFile, Message: d.Summary}
		if d.Detail != "" {
			p.Message += ": " + strings.TrimSuffix(d.Detail, ".")
		}
		if r := d.Subject; r != nil {
			p.Detail = fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
		}
		out = append(out, p)
	}
	return out
}
