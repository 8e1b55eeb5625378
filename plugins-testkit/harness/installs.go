// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/capyctl/capyctl/plugins-testkit/testbin"
)

// StoriesGGUF is the path of the real tiny model stories260K.gguf
// (sdk/formats/testdata; llama architecture, 5 layers, F32).
func StoriesGGUF() string {
	root, err := testbin.ModuleRoot()
	if err != nil {
		panic(err)
	}
	return filepath.Join(root, "sdk", "formats", "testdata", "stories260K.gguf")
}

// InstallFake installs the testkit's fake engine under a real engine's
// program name (llama-server, tensorfold) in dir, where the binary answers
// that engine's command line, and returns its path.
func (r *Role) InstallFake(dir, program string) string {
	r.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	p := filepath.Join(dir, program)
	if err := os.Symlink(r.FakeBin, p); err != nil && !os.IsExist(err) {
		r.t.Fatal(err)
	}
	return p
}

// AddLlamaServer registers the fake engine installed as llama-server
// (engine add <path>, detected as llama.cpp) with extra engine add
// arguments, and returns the binary's path.
func (r *Role) AddLlamaServer(name string, extra ...string) string {
	r.t.Helper()
	p := r.InstallFake(filepath.Join(r.StateDir, "engines", name, "bin"), "llama-server")
	args := append([]string{"engine", "add", p, "--name", name, "--yes"}, extra...)
	out, errOut, code := r.CLI(args...)
	if code != 0 {
		r.t.Fatalf("engine add %s: exit %d\n%s%s", p, code, out, errOut)
	}
	return p
}

// FakeTensorFoldVenv builds a TensorFold venv whose bin/tensorfold is the
// fake engine and whose metadata names the version; with toolchain, fake
// ninja, nvcc and c++ are in its bin. It returns the venv's path.
func (r *Role) FakeTensorFoldVenv(name, version string, toolchain bool) string {
	r.t.Helper()
	venv := filepath.Join(r.StateDir, "engines", name)
	return MakeTensorFoldVenv(r.t, venv, r.FakeBin, version, toolchain)
}

// fatalf is the part of testing.TB the venv builder needs.
type fatalf interface {
	Helper()
	Fatal(args ...any)
}

// MakeTensorFoldVenv builds a fake TensorFold venv at venv (see
// FakeTensorFoldVenv) around the fake engine binary fake.
func MakeTensorFoldVenv(t fatalf, venv, fake, version string, toolchain bool) string {
	t.Helper()
	bin := filepath.Join(venv, "bin")
	dist := filepath.Join(venv, "lib", "python3.12", "site-packages", fmt.Sprintf("tensorfold-%s.dist-info", version))
	for _, d := range []string{bin, dist} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(dist, "METADATA"): fmt.Sprintf("Metadata-Version: 2.1\nName: tensorfold\nVersion: %s\n", version),
		filepath.Join(bin, "python3"):   "#!/bin/sh\nexit 0\n",
	}
	if toolchain {
		for _, tool := range []string{"ninja", "nvcc", "c++"} {
			files[filepath.Join(bin, tool)] = "#!/bin/sh\nexit 0\n"
		}
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(fake, filepath.Join(bin, "tensorfold")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink("python3", filepath.Join(bin, "python")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	return venv
}

// PutModel copies files into a model directory under the models root
// (name → source path) and returns the directory.
func (r *Role) PutModel(model string, files map[string]string) string {
	r.t.Helper()
	dir := filepath.Join(r.StateDir, "models", model)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	for name, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	return dir
}

// DeployFile writes a spec and runs capyctl deploy with args, without
// creating model directories (see Deploy).
func (r *Role) DeployFile(name, spec string, args ...string) (string, string, int) {
	r.t.Helper()
	f := r.WriteFile("specs/"+name+".hcl", spec)
	return r.CLI(append([]string{"deploy", "--file", f}, args...)...)
}

// MustDeployFile is DeployFile with --activate --wait, failing the test
// unless the deployment becomes ready.
func (r *Role) MustDeployFile(name, spec string) {
	r.t.Helper()
	out, errOut, code := r.DeployFile(name, spec, "--activate", "--wait")
	if code != 0 {
		r.t.Fatalf("deploy %s: exit %d\n%s%s\nrole output:\n%s", name, code, out, errOut, tail(r.Output(), 40))
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
