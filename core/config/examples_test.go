// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite configs/roles from WriteDefault")

// TestExamples loads every role configuration under configs/roles, and
// checks that each one is what `capyctl init <role>` writes, so that the
// examples cannot rot (go test ./core/config -update rewrites them).
func TestExamples(t *testing.T) {
	dir := filepath.Join("..", "..", "configs", "roles")
	for _, role := range Roles {
		t.Run(role, func(t *testing.T) {
			path := filepath.Join(dir, role+".hcl")
			var want bytes.Buffer
			if err := WriteDefault(role, &want); err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(path, want.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./core/config -update writes it)", err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("%s differs from WriteDefault(%q); go test ./core/config -update rewrites it", path, role)
			}
			c, err := Load(LoadOptions{File: path, Env: []string{"HOME=/h"}})
			if err != nil {
				t.Fatal(err)
			}
			if c.Role != role {
				t.Errorf("role = %q, want %q", c.Role, role)
			}
		})
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, err := Load(LoadOptions{File: f, Env: []string{"HOME=/h"}}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
