// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportGuards proves that the SDK a third-party driver author imports
// pulls in nothing of CapyCTL's core or first-party drivers.
func TestImportGuards(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/capyctl/capyctl/sdk/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/capyctl/capyctl/core") || strings.HasPrefix(pkg, "github.com/capyctl/capyctl/drivers") {
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("sdk depends on %v", bad)
	}
}
