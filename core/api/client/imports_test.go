// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportGuards keeps the management client usable by a controller
// program: it may import the API's wire types, core/structs' pure types
// and the state directory's files (core/runinfo), nothing else of the core.
func TestImportGuards(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/capyctl/capyctl/core/api/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/capyctl/capyctl/core/api/client": true,
		"github.com/capyctl/capyctl/core/api/wire":   true,
		"github.com/capyctl/capyctl/core/runinfo":    true,
		"github.com/capyctl/capyctl/core/structs":    true,
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/capyctl/capyctl/") && !allowed[pkg] {
			t.Errorf("the management client depends on %s", pkg)
		}
	}
}
