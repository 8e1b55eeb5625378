// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports_RouterLinksNoLifecycle: the request path reads route tables
// from core/routes and counts from core/admission; it links neither the
// lifecycle, nor the plugin manager, nor gRPC, nor the model downloader.
func TestImports_RouterLinksNoLifecycle(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/capyctl/capyctl/core/router").Output()
	if err != nil {
		t.Skip("go list is not available:", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/capyctl/capyctl/core/lifecycle",
			"github.com/capyctl/capyctl/core/pluginmgr",
			"github.com/capyctl/capyctl/core/models",
			"google.golang.org/grpc",
			"github.com/hashicorp/go-plugin",
		} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("core/router links %s", dep)
			}
		}
	}
}
