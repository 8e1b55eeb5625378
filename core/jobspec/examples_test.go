// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestExamples parses and validates every job spec under configs/jobs, so
// that the examples the docs point to cannot rot.
func TestExamples(t *testing.T) {
	var files []string
	for _, pattern := range []string{"*.hcl", "*.json"} {
		m, err := filepath.Glob(filepath.Join("..", "..", "configs", "jobs", pattern))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatal("no job specs under configs/jobs")
	}
	var all []*structs.Deployment
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			ds, err := ParseFile(f)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ds...)
			for _, d := range ds {
				if err := Validate(d); err != nil {
					t.Errorf("%s: %v", d.Name, err)
				}
			}
		})
	}
	// The examples deploy side by side.
	if err := CheckConflicts(all); err != nil {
		t.Error(err)
	}
}
