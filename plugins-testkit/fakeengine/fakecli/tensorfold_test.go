// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestTensorFold_Version(t *testing.T) {
	p := startProc(t, "/venv/bin/tensorfold", []string{"--version"})
	if code := p.wait(t); code != 0 || strings.TrimSpace(p.stdout.String()) != "tensorfold 0.6.6" {
		t.Fatalf("exit %d, stdout %q", code, p.stdout)
	}
}

// TestTensorFold_MemoryCap: the KV cache fills what the cap leaves beside
// the weights, so the engine never holds more than its cap.
func TestTensorFold_MemoryCap(t *testing.T) {
	g, devs := newSimGPU(t, 8<<30)
	p := startProc(t, "tensorfold", []string{"serve", t.TempDir(), "--name", "fold", "--host", "127.0.0.1", "--port", "0",
		"--parallel", "4", "--context", "4096", "--no-drafts", "--no-update-check", "--backend", "cuda", "--snapshot-dir", "none",
		"--max-tokens", "512", "--no-thinking", "--kv-dtype", "fp8"},
		"CAPYCTL_SIMGPU_STATE="+g.Path(), "CAPYCTL_FAKE_SIM_WEIGHTS=1GiB", "TENSORFOLD_CUDA_MEMORY_LIMIT_GB=2.5")
	p.waitListening(t)
	p.waitFor(t, "ready", func() bool {
		status, body := p.get("/health")
		return status == 200 && strings.Contains(body, `"ok":true`)
	})
	got := holdings(t, g, devs, p.cmd.Process.Pid)
	if got["0/weights"] != 1<<30 || got["0/kv_cache"] != 3<<29 {
		t.Fatalf("simulated GPU holds %v, want 1 GiB of weights and 1.5 GiB of KV", got)
	}
	if status, body := p.chat(t, "fold"); status != 200 {
		t.Fatalf("chat: %d %s", status, body)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

func TestTensorFold_Refusals(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		env    []string
		code   int
		stderr string
	}{
		{"cap below the weights", []string{"serve", "/tmp", "--name", "fold", "--port", "0"}, []string{"CAPYCTL_FAKE_SIM_WEIGHTS=3GiB", "TENSORFOLD_CUDA_MEMORY_LIMIT_GB=2"}, 1, "cannot hold"},
		{"no name", []string{"serve", "/tmp", "--port", "0"}, nil, 2, "--name is required"},
		{"no model dir", []string{"serve", "--name", "x"}, nil, 2, "model directory comes first"},
		{"not serve", []string{"run"}, nil, 2, "usage"},
		{"unknown option", []string{"serve", "/tmp", "--name", "x", "--frob"}, nil, 2, "frob"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startProc(t, "tensorfold", c.args, c.env...)
			if code := p.wait(t); code != c.code || !strings.Contains(p.stderr.String(), c.stderr) {
				t.Fatalf("exit %d, stderr:\n%s", code, p.stderr)
			}
		})
	}
}

// TestTensorFold_SafetensorsWeights: without a knob, the weights on the
// simulated GPU are the model directory's safetensors.
func TestTensorFold_SafetensorsWeights(t *testing.T) {
	dir := t.TempDir()
	hdr := `{"w":{"dtype":"F16","shape":[512],"data_offsets":[0,1024]}}`
	b := make([]byte, 8+len(hdr)+1024)
	b[0] = byte(len(hdr))
	copy(b[8:], hdr)
	os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644)
	g, devs := newSimGPU(t, 1<<30)
	p := startProc(t, "tensorfold", []string{"serve", dir, "--name", "fold", "--port", "0"}, "CAPYCTL_SIMGPU_STATE="+g.Path())
	p.waitListening(t)
	p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
	if got := holdings(t, g, devs, p.cmd.Process.Pid); got["0/weights"] != 1024 {
		t.Fatalf("holds %v", got)
	}
}
