// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// storiesGGUF is the real tiny model the format tests read.
var storiesGGUF, _ = filepath.Abs("../../../sdk/formats/testdata/stories260K.gguf")

func TestLlamaServer_Version(t *testing.T) {
	p := startProc(t, "/opt/llama/bin/llama-server", []string{"--version"})
	if code := p.wait(t); code != 0 || !strings.HasPrefix(p.stderr.String(), "version: 0.7.0 (") {
		t.Fatalf("exit %d, stderr %q", code, p.stderr)
	}
	p = startProc(t, "llama-server", []string{"--version"}, llamaVersionEnv+"=4748")
	if p.wait(t); !strings.HasPrefix(p.stderr.String(), "version: 4748 (") {
		t.Fatalf("stderr %q", p.stderr)
	}
}

// TestLlamaServer_RealArgv runs the fake with the command line llama-server
// was observed with, on the real stories260K.gguf: -c 512 -np 2 gives 256
// tokens a slot, the model card shows the header's figures, and SIGTERM
// ends it with status 134 after llama-server's last lines.
func TestLlamaServer_RealArgv(t *testing.T) {
	g, devs := newSimGPU(t, 1<<30)
	p := startProc(t, "llama-server", []string{"-m", storiesGGUF, "--host", "127.0.0.1", "--port", "0", "-c", "512", "-np", "2",
		"--metrics", "--slots", "--alias", "tiny-stories", "--log-timestamps", "--log-prefix"},
		"LLAMA_API_KEY=sekrit", "CAPYCTL_SIMGPU_STATE="+g.Path())
	p.waitListening(t)
	p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
	status, body := p.get("/props", "X-Api-Key", "sekrit")
	var props struct {
		Default struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots int    `json:"total_slots"`
		ModelPath  string `json:"model_path"`
	}
	if json.Unmarshal([]byte(body), &props); status != 200 || props.TotalSlots != 2 || props.Default.NCtx != 256 || props.ModelPath != storiesGGUF {
		t.Fatalf("props: %d %s", status, body)
	}
	_, body = p.get("/v1/models")
	if !strings.Contains(body, `"id":"tiny-stories"`) || !strings.Contains(body, `"n_params":292800`) || !strings.Contains(body, `"size":1171200`) || !strings.Contains(body, `"n_ctx_train":2048`) || !strings.Contains(body, `"n_vocab":512`) {
		t.Fatalf("models: %s", body)
	}
	if status, _ := p.get("/metrics"); status != 401 {
		t.Fatalf("metrics without the key: %d", status)
	}
	if status, body := p.get("/metrics", "Authorization", "Bearer sekrit"); status != 200 || !strings.Contains(body, "llamacpp:requests_processing 0") {
		t.Fatalf("metrics: %d %s", status, body)
	}
	// On the simulated GPU: the weights (1,171,200 bytes) and the KV cache
	// of -c 512 at 640 bytes a token (F16: 5 layers × 4 KV heads × 8 × 2 × 2).
	want := map[string]int64{"0/weights": 1171200, "0/kv_cache": 512 * 640}
	if got := holdings(t, g, devs, p.cmd.Process.Pid); len(got) != 2 || got["0/weights"] != want["0/weights"] || got["0/kv_cache"] != want["0/kv_cache"] {
		t.Fatalf("simulated GPU holds %v, want %v", got, want)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 134 {
		t.Fatalf("exit code after SIGTERM %d, want 134", code)
	}
	if out := p.stdout.String(); !strings.Contains(out, "cleaning up before exit...") || !strings.Contains(out, "terminate called without an active exception") {
		t.Fatalf("last lines:\n%s", out)
	}
}

func TestLlamaServer_Refusals(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no model", []string{"--port", "0"}, 134, "exiting due to model loading error"},
		{"missing model", []string{"--model", "/nonexistent.gguf", "--port", "0"}, 134, "error loading model"},
		{"not gguf", []string{"--model", "llamaserver.go", "--port", "0"}, 134, "not a GGUF file"},
		{"unknown option", []string{"--model", storiesGGUF, "--frobnicate"}, 1, "invalid argument: --frobnicate"},
		{"missing value", []string{"--model"}, 1, "expected value"},
		{"bad number", []string{"--model", storiesGGUF, "-np", "two"}, 1, "not a number"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startProc(t, "llama-server", c.args)
			if code := p.wait(t); code != c.code || !strings.Contains(p.stderr.String(), c.stderr) {
				t.Fatalf("exit %d, stderr:\n%s", code, p.stderr)
			}
			if strings.Contains(p.stdout.String(), "listening on") {
				t.Fatalf("a failed load answered HTTP:\n%s", p.stdout)
			}
		})
	}
}
