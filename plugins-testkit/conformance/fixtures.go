// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/ports"
	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
	"github.com/capyctl/capyctl/plugins-testkit/testbin"
)

// BuiltinDriver returns a Target.Driver that serves one of capyctl's
// built-in drivers (`capyctl driver <family>`), from the binaries testbin
// finds or builds.
func BuiltinDriver(family string) func(t testing.TB) *exec.Cmd {
	return func(t testing.TB) *exec.Cmd {
		capyctl, _ := testbin.Binaries(t)
		return exec.Command(capyctl, "driver", family)
	}
}

// ProgramDriver returns a Target.Driver that runs a driver binary (a
// third-party capyctl-driver-<name>).
func ProgramDriver(path string, args ...string) func(t testing.TB) *exec.Cmd {
	return func(testing.TB) *exec.Cmd { return exec.Command(path, args...) }
}

// FakeVenv makes a Python environment under dir whose interpreter is the
// testkit's fake engine: bin/python links to capyctl-fake-engine, so a
// driver that runs `<venv>/bin/python -m <module> ...` exactly as for a real
// engine starts the fake flavour of that module. dists are the
// distributions to list (name → version) as *.dist-info; extra are more
// files under site-packages (relative path → content). It returns the
// environment's root.
func FakeVenv(t testing.TB, dir string, dists, extra map[string]string) string {
	t.Helper()
	_, fake := testbin.Binaries(t)
	root := filepath.Join(dir, "venv")
	sp := filepath.Join(root, "lib", "python3.12", "site-packages")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fake, filepath.Join(root, "bin", "python")); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(dists))
	for n := range dists {
		names = append(names, n)
	}
	sort.Strings(names)
	files := map[string]string{}
	for _, n := range names {
		di := fmt.Sprintf("%s-%s.dist-info", n, dists[n])
		files[filepath.Join(di, "METADATA")] = fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n\n", n, dists[n])
		files[filepath.Join(di, "RECORD")] = fmt.Sprintf("%s/__init__.py,sha256=fake,1\n", n)
	}
	for k, v := range extra {
		files[k] = v
	}
	for rel, s := range files {
		p := filepath.Join(sp, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// FakeModel makes a model directory under dir: a Qwen3-like config.json,
// a chat template and a sparse weights file of weights bytes (no disk is
// used; the fake engine holds that much on the simulated GPU).
func FakeModel(t testing.TB, dir string, weights int64) string {
	t.Helper()
	m := filepath.Join(dir, "model")
	if err := os.MkdirAll(m, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"config.json": `{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"num_hidden_layers":28,"num_attention_heads":16,` +
			`"num_key_value_heads":8,"hidden_size":1024,"head_dim":128,"torch_dtype":"bfloat16","max_position_embeddings":40960}`,
		"tokenizer_config.json": `{"chat_template":"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<think>\n"}`,
	}
	for n, s := range files {
		if err := os.WriteFile(filepath.Join(m, n), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(filepath.Join(m, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(weights); err != nil {
		t.Fatal(err)
	}
	return m
}

// simGPU is a one-card simulated GPU.
type simGPU struct {
	gpu *simgpu.GPU
	dev simgpu.Device
}

func newSimGPU(t testing.TB, dir string, total int64) *simGPU {
	t.Helper()
	path := filepath.Join(dir, "simgpu.json")
	dev := simgpu.DefaultDevices(1, total)[0]
	if err := simgpu.Create(path, []simgpu.Device{dev}); err != nil {
		t.Fatal(err)
	}
	g, err := simgpu.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return &simGPU{gpu: g, dev: dev}
}

// heldBy is what a set of processes hold on the card.
func (s *simGPU) heldBy(t testing.TB, pids []int) int64 {
	t.Helper()
	st, err := s.gpu.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	in := map[int]bool{}
	for _, p := range pids {
		in[p] = true
	}
	var n int64
	for _, a := range st.Allocations {
		if in[a.PID] {
			n += a.Bytes
		}
	}
	return n
}

// freePort leases a loopback port for the test's life (see
// plugins-testkit/ports): the engine binds it later, and no other test,
// here or in another test process, is given it meanwhile.
func freePort(t testing.TB) int {
	t.Helper()
	return ports.Lease(t)
}
