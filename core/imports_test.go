// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package core_test holds the layering rules of the whole module as one
// table test: the arrows of ARCHITECTURE.md (cmd → core → sdk, drivers →
// sdk) and the leaves that must stay leaves. The SDK's module set and the
// management client's dependencies have guards of their own
// (core/sdkmodules_test.go, core/api/client/imports_test.go).
package core_test

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/capyctl/capyctl"

// cliAllowed is every package of this module the CLI's commands may
// import directly: the agent's one entry point, the management client and
// its wire types, the job spec and configuration packages, the error
// catalogue and the build stamp (both pure values the client shares), the
// SDK (the driver plugin server of `capyctl driver`, the shim, the flag
// policy's names), and the first-party drivers (served by `capyctl driver
// <family>` and asked in process by `capyctl engine flags` when no role
// runs), the fake engine's command line (`capyctl fake-engine`, which
// `capyctl dev` runs), and the role process's runtime setting (sysmonpace:
// the standard library only). Nothing else of the core.
var cliAllowed = []string{
	module + "/cmd/capyctl/command",
	module + "/cmd/capyctl/internal/sysmonpace",
	module + "/core/agent",
	module + "/core/api/client",
	module + "/core/api/wire",
	module + "/core/jobspec",
	module + "/core/config",
	module + "/core/structs",
	module + "/core/version",
	module + "/sdk",
	module + "/sdk/flags",
	module + "/sdk/plugin",
	module + "/sdk/proc",
	module + "/drivers/custom",
	module + "/drivers/llamacpp",
	module + "/drivers/sglang",
	module + "/drivers/tensorfold",
	module + "/drivers/vllm",
	module + "/plugins-testkit/fakeengine/fakecli",
}

// binaryTestkitAllowed is what the capyctl binary may link of the testkit:
// the fake engine of `capyctl dev` (its command line, its engines, and the
// simulated GPU state it allocates on). Nothing else: a package added here
// is product code, documented as such.
var binaryTestkitAllowed = []string{
	module + "/plugins-testkit/fakeengine",
	module + "/plugins-testkit/fakeengine/fakecli",
	module + "/plugins-testkit/simgpu",
}

// importRule is one layering rule: what pkgs import (directly, or linked
// when deps is set) must pass allow.
type importRule struct {
	name string
	pkgs []string
	// deps checks everything the packages link, not only their imports.
	deps bool
	// forbidden says whether a package breaks the rule.
	forbidden func(pkg string) bool
	// tests checks the packages' test imports too (direct imports only).
	tests bool
	// exempt, when set, says which importers the rule lets through
	// (direct imports only).
	exempt func(importer string) bool
	// skip, when set, is why the rule cannot hold yet.
	skip string
}

// TestImportGuards checks every layering rule with `go list`.
func TestImportGuards(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not on PATH")
	}
	under := func(prefixes ...string) func(string) bool {
		return func(pkg string) bool {
			for _, p := range prefixes {
				if pkg == p || strings.HasPrefix(pkg, p+"/") {
					return true
				}
			}
			return false
		}
	}
	cases := []importRule{
		{
			name: "the sdk links nothing of the core, the drivers or the CLI",
			pkgs: []string{module + "/sdk/..."}, deps: true,
			forbidden: under(module+"/core", module+"/drivers", module+"/cmd"),
		},
		{
			name: "the drivers link nothing of the core or the CLI",
			pkgs: []string{module + "/drivers/..."}, deps: true,
			forbidden: under(module+"/core", module+"/cmd"),
		},
		{
			name: "the core links no driver and nothing of the CLI",
			pkgs: []string{module + "/core/..."}, deps: true,
			forbidden: under(module+"/drivers", module+"/cmd"),
		},
		{
			name: "the agent links no management client (the state directory's files are core/runinfo)",
			pkgs: []string{module + "/core/agent"}, deps: true,
			forbidden: under(module + "/core/api/client"),
		},
		{
			name: "the memory ledger links no network",
			pkgs: []string{module + "/core/ledger"}, deps: true,
			forbidden: func(pkg string) bool { return pkg == "net" || pkg == "net/http" },
		},
		{
			name: "the router links no lifecycle, plugin manager, model downloader or gRPC",
			pkgs: []string{module + "/core/router"}, deps: true,
			forbidden: under(module+"/core/lifecycle", module+"/core/pluginmgr", module+"/core/models", "google.golang.org/grpc", "github.com/hashicorp/go-plugin"),
		},
		{
			// The router and the server's relay share it: it stays a leaf
			// of the standard library.
			name: "the connection takeover links nothing of the module",
			pkgs: []string{module + "/core/takeover"}, deps: true,
			forbidden: func(pkg string) bool {
				return pkg != module+"/core/takeover" && under(module)(pkg)
			},
		},
		{
			name: "the replicated state machine links no network, raft, lifecycle or fleet server",
			pkgs: []string{module + "/core/fleet/fsm"}, deps: true,
			forbidden: func(pkg string) bool {
				return pkg == "net/http" || under(module+"/core/fleet/raftlog", module+"/core/lifecycle", module+"/core/api",
					"github.com/hashicorp/raft", "google.golang.org/grpc")(pkg) || pkg == module+"/core/fleet"
			},
		},
		{
			// The fleet's two sides meet only at the cluster address:
			// what both read (ALPN names, join bodies, error answers) is
			// core/fleet/linkwire, which links neither.
			name: "the host agent links no fleet server, raft log or state machine",
			pkgs: []string{module + "/core/fleet/hostagent"}, deps: true,
			forbidden: func(pkg string) bool {
				return pkg == module+"/core/fleet" || under(module+"/core/fleet/raftlog", module+"/core/fleet/fsm",
					module+"/core/fleet/scheduler", module+"/core/lifecycle", module+"/core/api")(pkg) && pkg != module+"/core/api/wire"
			},
		},
		{
			name: "the fleet server links no host agent",
			pkgs: []string{module + "/core/fleet"}, deps: true,
			forbidden: under(module + "/core/fleet/hostagent"),
		},
		{
			// The endpoints reach the server through serverapi.Server
			// alone, so a handler is tested against a fake: core/fleet
			// imports them, never the other way (which would be a cycle),
			// and nothing of the link, raft or the host agent comes in.
			name: "the server's endpoints link no fleet server, raft, host link or host agent",
			pkgs: []string{module + "/core/fleet/serverapi"}, deps: true,
			forbidden: func(pkg string) bool {
				return pkg == module+"/core/fleet" || under(module+"/core/fleet/raftlog", module+"/core/fleet/hostagent",
					module+"/core/fleet/scheduler", module+"/core/hostlink", "github.com/hashicorp/raft", "google.golang.org/grpc")(pkg)
			},
		},
		{
			name: "the link's shared wire links neither side of the fleet",
			pkgs: []string{module + "/core/fleet/linkwire"}, deps: true,
			forbidden: func(pkg string) bool {
				return pkg == module+"/core/fleet" || under(module+"/core/fleet/hostagent")(pkg)
			},
		},
		{
			// Placement decisions are pure functions of what the leader
			// read (issue #27): no clock, no randomness, no I/O, nothing
			// of the module, so the same hosts give the same placement on
			// every leader and in every test.
			name: "the fleet scheduler is pure functions: no clock, randomness, I/O or module package",
			pkgs: []string{module + "/core/fleet/scheduler"}, deps: true,
			forbidden: func(pkg string) bool {
				return under(module)(pkg) && pkg != module+"/core/fleet/scheduler" ||
					under("time", "math/rand", "crypto/rand", "os", "net", "syscall")(pkg)
			},
		},
		{
			name: "the raft log links the state machine, not the fleet server",
			pkgs: []string{module + "/core/fleet/raftlog"}, deps: true,
			forbidden: func(pkg string) bool {
				return pkg == module+"/core/fleet" || under(module+"/core/api", module+"/core/lifecycle")(pkg)
			},
		},
		{
			// The fake engine is the product's too: `capyctl dev` runs it
			// as `capyctl fake-engine`, so that the tour needs nothing but
			// the released binary. It stays in the testkit, beside the
			// fakes it shares its engines' faithful APIs with, and is the
			// one part of the testkit the binary may link
			// (binaryTestkitAllowed); the harness, the conformance suite,
			// the faults, the port locks and the end-to-end helpers stay
			// out.
			name: "the binary links no test support (the testkit but its fake engine, the end-to-end helpers)",
			pkgs: []string{module + "/cmd/capyctl"}, deps: true,
			forbidden: func(pkg string) bool {
				if slices.Contains(binaryTestkitAllowed, pkg) {
					return false
				}
				return under(module+"/plugins-testkit", module+"/cmd/capyctl/internal/e2e")(pkg)
			},
		},
		{
			// A fake that read the drivers' fact tables could never fail a
			// test when a driver's fact is wrong: the fakes keep their own
			// (plugins-testkit/fakeengine/facts.go).
			name: "the fake engines link nothing of the drivers' facts, the engine kit, the drivers or the core",
			pkgs: []string{module + "/plugins-testkit/fakeengine", module + "/plugins-testkit/fakeengine/fakecli", module + "/plugins-testkit/cmd/capyctl-fake-engine"}, deps: true,
			forbidden: under(module+"/sdk/enginefacts", module+"/sdk/enginekit", module+"/drivers", module+"/core"),
		},
		{
			// IMPORTANT: drivers and the core speak the SDK's Go types
			// (sdk.Driver, sdk.StartRequest, ...); the generated protobuf
			// messages stay behind sdk/plugin, which converts at the gRPC
			// boundary. A package that reached for them would make the
			// wire format its vocabulary again.
			name: "only sdk/plugin imports the generated driver protocol",
			pkgs: []string{module + "/...", module + "/sdk/..."}, tests: true,
			forbidden: under(module + "/sdk/proto/driverv1"),
			exempt: func(importer string) bool {
				return importer == module+"/sdk/plugin" || importer == module+"/sdk/proto/driverv1"
			},
		},
		{
			name: "the CLI imports only the agent entry, the client, wire types, job specs and config",
			pkgs: []string{module + "/cmd/capyctl", module + "/cmd/capyctl/command"},
			forbidden: func(pkg string) bool {
				if !strings.HasPrefix(pkg, module+"/") {
					return false
				}
				for _, ok := range cliAllowed {
					if pkg == ok {
						return false
					}
				}
				return true
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.skip != "" {
				t.Skip(c.skip)
			}
			bad := violations(t, c)
			if len(bad) > 0 {
				t.Fatalf("%s:\n%s", c.name, strings.Join(bad, "\n"))
			}
		})
	}
}

// violations lists what breaks a rule, as "importer -> imported" for
// direct imports and as the linked package for deps.
func violations(t *testing.T, c importRule) []string {
	t.Helper()
	format := "{{.ImportPath}}:{{join .Imports \" \"}}"
	if c.tests {
		format += " {{join .TestImports \" \"}} {{join .XTestImports \" \"}}"
	}
	args := []string{"list", "-f", format}
	if c.deps {
		args = []string{"list", "-deps", "-f", "{{.ImportPath}}:"}
	}
	out, err := exec.Command("go", append(args, c.pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		if c.deps {
			if c.forbidden(pkg) {
				seen[pkg] = true
			}
			continue
		}
		if c.exempt != nil && c.exempt(pkg) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if c.forbidden(imp) {
				seen[pkg+" -> "+imp] = true
			}
		}
	}
	bad := make([]string, 0, len(seen))
	for s := range seen {
		bad = append(bad, s)
	}
	sort.Strings(bad)
	return bad
}
