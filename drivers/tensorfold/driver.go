// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package tensorfold is the driver of TensorFold (SPEC E4; verified 0.6.0
// to 0.6.3, 0.6.5 and 0.6.6): `<venv>/bin/tensorfold serve <model dir>` on
// a private loopback port, capped by TENSORFOLD_CUDA_MEMORY_LIMIT_GB at the
// deployment's ready allocation (a TensorFold deployment states its
// resources and context_length), --parallel from max_concurrent_requests
// (8 when undeclared), readiness that waits out the CUDA kernels
// TensorFold builds on its first request, and the idle signal from
// /health. TensorFold cannot release its memory while it runs: it is
// restart only. Its build tools (ninja, nvcc, a C++ compiler) must be on
// the engine's PATH when it is registered (toolchain_missing, exit 26).
//
// A group runs TensorFold's two-machine tensor parallel: exactly two
// machines, topology tensor_parallel 2 and pipeline_parallel 1 (anything
// else is group_shape_unsupported:tensorfold), restart only. Each rank
// gets --tp 2 --rank r --master <head address> --master-port <rendezvous
// port> and GLOO_SOCKET_IFNAME for the host's peer address (no NCCL_*); the
// head serves the API, rank 1 serves no HTTP and is ready once it runs.
package tensorfold

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// Family is this driver's engine family.
const Family = "tensorfold"

// VerifiedVersions are the TensorFold releases CapyCTL is verified with
// (0.6.4 was not checked); others run as custom.
var VerifiedVersions = enginefacts.TensorFold.Verified

// Installation details recorded by Detect (pyengine.Detect records the
// venv).
const (
	detailVenv     = "venv"
	detailCUDAHome = "cuda_home"
	detailToolDirs = "tool_dirs"
)

// Driver is the TensorFold driver.
type Driver struct {
	enginekit.RestartOnly
	// Version is the driver\'s version in Describe: the capyctl build that
	// serves it sets its own (`capyctl driver <family>`); the driver does
	// not import the core to learn it.
	Version string
	reg     *enginekit.Registry[*enginekit.Instance]
	// systemPath ends the engine's PATH and is searched for build tools
	// (tests point it at an empty directory).
	systemPath string
	// getenv reads the driver's environment (CUDA_HOME).
	getenv func(string) string
	// defaultCUDA is the toolkit directory used when CUDA_HOME names none.
	defaultCUDA string
	// rdmaDir lists the host's RDMA devices for require_rdma
	// (enginekit.DefaultRDMADir when ""; tests point it elsewhere).
	rdmaDir string
}

var (
	_ sdk.Driver     = (*Driver)(nil)
	_ sdk.ExitWaiter = (*Driver)(nil)
)

// New returns the driver.
func New() *Driver {
	return &Driver{reg: enginekit.NewRegistry[*enginekit.Instance](), systemPath: enginekit.SystemPath, getenv: os.Getenv, defaultCUDA: "/usr/local/cuda"}
}

// Describe implements sdk.Driver: restart only, chat, aborts by closing
// the connection, an idle signal.
func (d *Driver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return enginekit.Describe(Family, d.Version, &sdk.Capabilities{
		APIs:       []string{"chat"},
		AbortMode:  sdk.AbortModeCloseConnection,
		IdleSignal: true,
		Groups:     true,
	}, pyengine.ConfigSchema(Family, configKeys)), nil
}

// Detect implements sdk.Driver: a venv with a tensorfold distribution and
// its bin/tensorfold, read without running Python; the build tools
// TensorFold compiles its kernels with are looked for on the engine's PATH
// (the venv's bin, pip's CUDA compiler, the CUDA toolkit's bin, the
// system's) and the missing ones reported.
func (d *Driver) Detect(_ context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	v, resp, err := pyengine.Detect(req.Path, pyengine.DetectSpec{Family: Family, Dist: "tensorfold", Verified: VerifiedVersions})
	if err != nil {
		return nil, err
	}
	resp.Program = filepath.Join(v.Dir, "bin", "tensorfold")
	if st, err := os.Stat(resp.Program); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, sdk.Errorf(sdk.CodeEngineNotFound, "%s has tensorfold %s installed but no executable bin/tensorfold", v.Dir, resp.Version)
	}
	cuda := d.cudaHome()
	dirs := toolDirs(v)
	resp.ToolchainMissing = d.missingTools(v.Dir, dirs, cuda)
	resp.Notes = []string{
		"TensorFold runs restart only: CapyCTL stops it when it needs the memory and starts it on the next request",
		"a TensorFold deployment states its resources and context_length; the engine is capped at its ready allocation",
		"the first request after a start builds CUDA kernels; the first start may take up to 30 minutes",
	}
	if !resp.Verified {
		resp.Notes = append(resp.Notes, "TensorFold "+resp.Version+" is not a verified version: it runs as custom")
	}
	if cuda != "" {
		resp.Details[detailCUDAHome] = cuda
	}
	if len(dirs) > 0 {
		resp.Details[detailToolDirs] = strings.Join(dirs, ":")
	}
	return resp, nil
}

// cudaHome is $CUDA_HOME when it has bin/nvcc, else the default toolkit
// directory when it has, else "".
func (d *Driver) cudaHome() string {
	for _, c := range []string{d.getenv("CUDA_HOME"), d.defaultCUDA} {
		if c == "" {
			continue
		}
		if isExecutable(filepath.Join(c, "bin", "nvcc")) {
			return c
		}
	}
	return ""
}

// toolDirs are the directories inside the venv that pip's CUDA packages
// put compilers in (cuda-toolkit[nvcc]: site-packages/nvidia/*/bin).
func toolDirs(v *pyengine.Venv) []string {
	var out []string
	for _, sp := range v.SitePackages {
		matches, _ := filepath.Glob(filepath.Join(sp, "nvidia", "*", "bin"))
		sort.Strings(matches)
		out = append(out, matches...)
	}
	return out
}

// enginePath is the engine's PATH: the venv's bin, pip's compiler
// directories, the toolkit's bin, the system's.
func (d *Driver) enginePath(venv string, toolDirs []string, cuda string) string {
	parts := []string{filepath.Join(venv, "bin")}
	parts = append(parts, toolDirs...)
	if cuda != "" {
		parts = append(parts, filepath.Join(cuda, "bin"))
	}
	if d.systemPath != "" {
		parts = append(parts, d.systemPath)
	}
	return strings.Join(parts, ":")
}

// buildTools are the tools TensorFold compiles its kernels with: each row
// is satisfied by any of its names.
var buildTools = [][]string{{"ninja"}, {"nvcc"}, {"c++", "g++", "clang++"}}

// missingTools lists the build tools the engine's PATH lacks.
func (d *Driver) missingTools(venv string, toolDirs []string, cuda string) []string {
	dirs := strings.Split(d.enginePath(venv, toolDirs, cuda), ":")
	var missing []string
	for _, names := range buildTools {
		found := false
		for _, n := range names {
			for _, dir := range dirs {
				if dir != "" && isExecutable(filepath.Join(dir, n)) {
					found = true
				}
			}
		}
		if !found {
			missing = append(missing, names[0])
		}
	}
	return missing
}

// isExecutable reports an executable regular file (links followed).
func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Flags implements sdk.Driver.
func (d *Driver) Flags(context.Context, *sdk.FlagsRequest) (*sdk.FlagsResponse, error) {
	return Table.Response(), nil
}
