// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package drivers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// storiesSpec deploys stories260K.gguf on llama.cpp with the default 4
// slots.
const storiesSpec = `deployment "stories" {
  engine = "llamacpp"
  model {
    path = "stories"
  }
}
`

// TestLlamaCpp_WholeRole runs a standalone role on a simulated card with
// the fake llama-server registered through engine add, deploys the real
// stories260K.gguf and checks the sizing status shows (derived from the
// GGUF header, see drivers/llamacpp TestSize_Stories260K):
//
//	weights 1,171,200 B; KV cache 2048 tokens × 4 slots × 640 B = 5,242,880 B;
//	ready on the card 6,414,080 B; host RAM 256 MiB.
func TestLlamaCpp_WholeRole(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{})
	bin := r.AddLlamaServer("llamacpp")
	out, errOut, code := r.CLI("engine", "list", "--json")
	if code != 0 || !strings.Contains(out, `"family":"llamacpp"`) || !strings.Contains(out, `"version":"0.7.0"`) || !strings.Contains(out, bin) {
		t.Fatalf("engine list: %d %s%s", code, out, errOut)
	}
	r.PutModel("stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
	r.MustDeployFile("stories", storiesSpec)

	st := e2e.Status(t, r, "stories")
	if st.State != "ready" || st.Instances[0].Driver != "llamacpp" || st.Instances[0].Residency != "restart_only" {
		t.Fatalf("status %+v", st)
	}
	mem := st.Memory
	num := func(v any) int64 { f, _ := v.(float64); return int64(f) }
	ready, _ := mem["ready"].(map[string]any)
	if num(mem["weights_bytes"]) != 1_171_200 || num(mem["kv_cache_bytes"]) != 5_242_880 ||
		num(ready["device_bytes"]) != 6_414_080 || num(ready["host_bytes"]) != 268_435_456 || ready["provenance"] != "derived" {
		b, _ := json.Marshal(mem)
		t.Fatalf("memory %s", b)
	}
	b, _ := json.Marshal(map[string]any{"weights_bytes": mem["weights_bytes"], "kv_cache_bytes": mem["kv_cache_bytes"], "ready": mem["ready"], "startup": mem["startup"]})
	t.Logf("status deployment stories --json: memory %s", b)
	// The engine holds on the simulated card what the header says.
	var held int64
	for _, a := range r.SimState().Allocations {
		held += a.Bytes
	}
	if held != 6_414_080 {
		t.Fatalf("the fake llama-server holds %d bytes on the card, want 6,414,080", held)
	}

	// A streamed answer through the role: no role chunk from llama.cpp, the
	// last chunk carries usage and timings, then [DONE].
	resp, err := r.Chat(context.Background(), harness.ChatBody("stories", true, "Once upon a time"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat %d %s", resp.StatusCode, harness.ReadAll(resp))
	}
	var data []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, l)
		}
	}
	resp.Body.Close()
	if len(data) < 3 || data[len(data)-1] != "[DONE]" || !strings.Contains(data[len(data)-2], `"timings"`) || !strings.Contains(data[len(data)-2], `"usage"`) {
		t.Fatalf("stream %q", data)
	}

	// The flag table.
	out, _, code = r.CLI("engine", "flags", "llamacpp", "--format", "json")
	if code != 0 || !strings.Contains(out, `"name":"--api-key"`) || !strings.Contains(out, `"name":"LLAMA_ARG_*"`) {
		t.Fatalf("engine flags: %d %s", code, out)
	}

	// Restart only: a park stops it.
	if out, errOut, code := r.CLI("stop", "deployment", "stories", "--wait"); code != 0 {
		t.Fatalf("stop: %d %s%s", code, out, errOut)
	}
	harness.Eventually(t, 30*time.Second, "the card empty", func() bool { return len(r.SimState().Allocations) == 0 })
}

// TestLlamaCpp_WholeRoleRefusals: bad llama.cpp deployments are refused when
// written, with the code and the field.
func TestLlamaCpp_WholeRoleRefusals(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	r.AddLlamaServer("llamacpp")
	r.PutModel("stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
	cases := []struct {
		name, spec, code string
	}{
		{"parks deep", strings.Replace(storiesSpec, `engine = "llamacpp"`, "engine = \"llamacpp\"\n  residency = \"deep\"", 1), "capability_missing:deep_park"},
		{"unknown key", strings.Replace(storiesSpec, "  model {", "  engine_config {\n    llamacpp {\n      threads = 8\n    }\n  }\n  model {", 1), "unknown_config_key:threads"},
		{"reserved env", strings.Replace(storiesSpec, "  model {", "  engine_config {\n    env = { LLAMA_ARG_HOST = \"0.0.0.0\" }\n  }\n  model {", 1), "engine_env_reserved:LLAMA_ARG_HOST"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := r.DeployFile("stories", c.spec)
			if code == 0 || !strings.Contains(errOut, c.code) {
				t.Fatalf("exit %d: %s", code, errOut)
			}
		})
	}
}

// TestLlamaCpp_UnknownBuild: a llama-server built from a source tarball
// prints "version: 0 (unknown)". It registers as an "unknown build" (engine
// list, engine add, role status say so plainly, not "b0"), its options are
// read from its --help, and it serves.
func TestLlamaCpp_UnknownBuild(t *testing.T) {
	r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{})
	// The fake answers as llama-server from its program name; a wrapper
	// prints a tarball build's version and runs the fake for the rest.
	fake := r.InstallFake(filepath.Join(r.StateDir, "fake"), "llama-server")
	bin := r.WriteFile("tarball/llama-server", "#!/bin/sh\n"+
		"if [ \"$1\" = --version ]; then echo 'version: 0 (unknown)' >&2; echo 'built with cc (GCC) 12.2.0 for x86_64-linux-gnu' >&2; exit 0; fi\n"+
		"exec "+fake+" \"$@\"\n")
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := r.CLI("engine", "add", bin, "--name", "llamacpp", "--yes")
	if code != 0 || !strings.Contains(out, "llamacpp unknown build") {
		t.Fatalf("engine add: %d %s%s", code, out, errOut)
	}
	out, errOut, code = r.CLI("engine", "list")
	if code != 0 || !strings.Contains(out, "unknown build") || strings.Contains(out, "b0") {
		t.Fatalf("engine list: %d %s%s", code, out, errOut)
	}
	r.PutModel("stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
	r.MustDeployFile("stories", storiesSpec)
	e2e.ChatOK(t, r, "stories")
	out, errOut, code = r.CLI("status")
	if code != 0 || !strings.Contains(out, "(llamacpp unknown build)") {
		t.Fatalf("status: %d %s%s", code, out, errOut)
	}
}
