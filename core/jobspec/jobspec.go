// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package jobspec turns job specs into completed structs.Deployment values:
// it parses HCL (or HCL's JSON syntax), fills every default, records where
// each value came from (Provenance), and validates the result. It does no
// I/O beyond reading the file it is given.
//
// A job spec holds one or more deployment blocks:
//
//	deployment "chat-small" {
//	  engine = "vllm"
//	  model { path = "qwen3-4b" }
//	}
//
// Every refusal is a *structs.Error with code invalid_config whose message
// starts with "file:line:col: " of the first problem; Details["diagnostics"]
// lists all of them ([]Diagnostic).
package jobspec

import (
	"fmt"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk/hclbound"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
)

// Diagnostic is one problem found in a job spec. File, Line and Column are
// empty for a deployment that did not come from a file (the management
// API's JSON); Field then names the field.
type Diagnostic struct {
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Field   string `json:"field,omitempty"`
	Summary string `json:"summary"`
	Detail  string `json:"detail,omitempty"`
	// Code is the catalogue code of a refusal more precise than
	// invalid_config (group_placement_required), empty otherwise.
	Code structs.Code `json:"code,omitempty"`
}

// String renders "file:line:col: summary: detail".
func (d Diagnostic) String() string {
	var b strings.Builder
	switch {
	case d.File != "" && d.Line > 0:
		fmt.Fprintf(&b, "%s:%d:%d: ", d.File, d.Line, d.Column)
	case d.File != "":
		fmt.Fprintf(&b, "%s: ", d.File)
	}
	b.WriteString(d.Summary)
	if d.Detail != "" {
		b.WriteString(": ")
		b.WriteString(strings.TrimSuffix(d.Detail, "."))
	}
	return b.String()
}

// ParseFile reads and parses a job spec. A name ending in ".json" is read
// as HCL's JSON syntax.
func ParseFile(path string) ([]*structs.Deployment, error) {
	src, err := hclbound.ReadFile(path)
	if err != nil {
		e := diagError([]Diagnostic{{File: path, Summary: "cannot read the job spec", Detail: err.Error()}})
		e.Cause = err
		return nil, e
	}
	return Parse(src, path)
}

// Parse parses a job spec's source; filename names it in positions and
// selects the syntax (".json": HCL's JSON syntax, else native HCL). The
// deployments come back completed and validated, in file order.
func Parse(src []byte, filename string) ([]*structs.Deployment, error) {
	var (
		file  *hcl.File
		diags hcl.Diagnostics
	)
	// IMPORTANT: bound the source before a parser descends into it (see
	// sdk/hclbound: a deep one is a fatal stack overflow).
	if diags := hclbound.Check(src, filename); diags.HasErrors() {
		return nil, diagError(fromHCL(diags))
	}
	if strings.HasSuffix(filename, ".json") {
		file, diags = hcljson.Parse(src, filename)
	} else {
		file, diags = hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	}
	if diags.HasErrors() {
		return nil, diagError(fromHCL(diags))
	}
	specs, diags := decodeFile(file.Body)
	if diags.HasErrors() {
		return nil, diagError(fromHCL(diags))
	}
	var all []Diagnostic
	out := make([]*structs.Deployment, 0, len(specs))
	for _, s := range specs {
		complete(s.d, s.set.has)
		all = append(all, validate(s.d, s.pos, s.set.has)...)
		out = append(out, s.d)
	}
	all = append(all, conflicts(specs)...)
	if len(all) > 0 {
		return nil, diagError(all)
	}
	return out, nil
}

// Validate checks a completed deployment (one that went through Parse or
// FromJSON, or was stored): the same rules as Parse, with fields named
// instead of positioned.
func Validate(d *structs.Deployment) error {
	if d == nil {
		return structs.Errf(structs.CodeInvalidConfig, "no deployment")
	}
	if diags := validate(d, nil, nil); len(diags) > 0 {
		return diagError(diags)
	}
	return nil
}

// CheckConflicts refuses deployments that share a name or a route (the
// management API checks a new deployment against the stored ones with it).
func CheckConflicts(ds []*structs.Deployment) error {
	specs := make([]*spec, 0, len(ds))
	for _, d := range ds {
		specs = append(specs, &spec{d: d})
	}
	if diags := conflicts(specs); len(diags) > 0 {
		return diagError(diags)
	}
	return nil
}

// fromHCL converts HCL's diagnostics (errors only).
func fromHCL(diags hcl.Diagnostics) []Diagnostic {
	out := make([]Diagnostic, 0, len(diags))
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		out = append(out, diagAt(d.Subject, "", d.Summary, d.Detail))
	}
	return out
}

func diagAt(r *hcl.Range, field, summary, detail string) Diagnostic {
	d := Diagnostic{Field: field, Summary: summary, Detail: detail}
	if r != nil && r.Filename != "" {
		d.File, d.Line, d.Column = r.Filename, r.Start.Line, r.Start.Column
	}
	return d
}

// diagError builds the invalid_config error: the first diagnostic (by
// position) as the message, all of them in the details.
func diagError(diags []Diagnostic) *structs.Error {
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i], diags[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	msg := diags[0].String()
	if n := len(diags) - 1; n > 0 {
		msg = fmt.Sprintf("%s (and %d more)", msg, n)
	}
	code := structs.CodeInvalidConfig
	if diags[0].Code != "" {
		code = diags[0].Code
	}
	e := structs.Errf(code, "%s", msg).WithDetail("diagnostics", diags)
	if diags[0].Field != "" {
		e.WithDetail("field", diags[0].Field)
	}
	return e
}
