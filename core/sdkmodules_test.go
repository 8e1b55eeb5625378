// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package core_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// driverModules are the only modules a driver built on the SDK links
// besides this one: go-plugin and what it needs (gRPC, protobuf, hclog,
// yamux, oklog/run, and hclog's terminal colours), and golang.org/x/net,
// sys and text under gRPC. None of the core's own dependencies (bbolt,
// gorilla/mux, Prometheus, mitchellh/cli, go-nvml, goldmark, ...).
var driverModules = []string{
	module,
	module + "/sdk",
	"github.com/fatih/color",
	"github.com/golang/protobuf",
	"github.com/hashicorp/go-hclog",
	"github.com/hashicorp/go-plugin",
	"github.com/hashicorp/yamux",
	"github.com/mattn/go-colorable",
	"github.com/mattn/go-isatty",
	"github.com/oklog/run",
	"golang.org/x/net",
	"golang.org/x/sys",
	"golang.org/x/text",
	"google.golang.org/genproto/googleapis/rpc",
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
}

// hclModules are what sdk/hclbound adds (HCL and its own dependencies),
// for a driver that reads an HCL manifest.
var hclModules = []string{
	"github.com/agext/levenshtein",
	"github.com/apparentlymart/go-textseg/v15",
	"github.com/hashicorp/hcl/v2",
	"github.com/mitchellh/go-wordwrap",
	"github.com/zclconf/go-cty",
}

// TestImportGuards_SDKModule proves that what a third-party driver author
// imports (the SDK, the engine kit, the conformance suite and the testkit's
// fakes) pulls in nothing of CapyCTL's core or first-party drivers, and no
// module beyond the listed ones: they are importable without the core's
// dependencies. The example driver (website/examples/driver) links only the
// driver set. The SDK is a module of its own (sdk/go.mod): built from its
// own directory, with its own go.mod alone, it needs nothing of this one.
func TestImportGuards_SDKModule(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not on PATH")
	}
	cases := []struct {
		name    string
		dir     string // where go list runs: the module whose go.mod decides
		pkgs    []string
		modules []string
	}{
		{
			name:    "the SDK module on its own go.mod",
			dir:     "../sdk",
			pkgs:    []string{"./..."},
			modules: append([]string{module + "/sdk"}, append(slices.Clone(driverModules[2:]), hclModules...)...),
		},
		{
			name:    "a driver on the engine kit",
			pkgs:    []string{module + "/website/examples/driver", module + "/sdk/enginekit", module + "/sdk/plugin"},
			modules: driverModules,
		},
		{
			name: "the whole SDK and the author's testkit",
			pkgs: []string{module + "/sdk/...", module + "/plugins-testkit/conformance", module + "/plugins-testkit/fakeengine",
				module + "/plugins-testkit/simgpu", module + "/plugins-testkit/poll", module + "/plugins-testkit/testbin",
				module + "/plugins-testkit/cmd/capyctl-fake-engine"},
			modules: append(slices.Clone(driverModules), hclModules...),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}"}, c.pkgs...)
			cmd := exec.Command("go", args...)
			cmd.Dir = c.dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			var bad []string
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				pkg, mod, _ := strings.Cut(line, " ")
				switch {
				case strings.HasPrefix(pkg, module+"/core"), strings.HasPrefix(pkg, module+"/drivers"),
					strings.HasPrefix(pkg, module+"/plugins-testkit/harness"), strings.HasPrefix(pkg, module+"/cmd/capyctl"):
					bad = append(bad, pkg)
				case mod != "" && !slices.Contains(c.modules, mod):
					bad = append(bad, pkg+" (module "+mod+")")
				}
			}
			if len(bad) > 0 {
				t.Fatalf("%s links what it may not:\n%s", c.name, strings.Join(bad, "\n"))
			}
		})
	}
}
