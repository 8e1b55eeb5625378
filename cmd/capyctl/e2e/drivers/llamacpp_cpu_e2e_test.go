// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package drivers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// storiesLayersSpec deploys stories260K.gguf (5 layers) with n_gpu_layers.
func storiesLayersSpec(layers string) string {
	return strings.Replace(storiesSpec, "  model {",
		"  engine_config {\n    llamacpp {\n      n_gpu_layers = "+layers+"\n    }\n  }\n  model {", 1)
}

// TestLlamaCpp_OffloadCharges: a llama.cpp deployment is charged where its
// layers run, derived from the GGUF header of stories260K.gguf (5 layers,
// 1,171,200 B of weights, 4 slots × 2048 tokens × 640 B = 5,242,880 B of
// KV cache, 256 MiB of llama-server's own):
//
//	n_gpu_layers = 0 on a 4 GiB card: card 0 (at startup too); host 256 MiB + 1,171,200 + 5,242,880
//	n_gpu_layers = 0 without a gpu (gpu.provider = none): the same
//	n_gpu_layers = 2: card 363,520 (blk.3, blk.4) + 2/5 of the KV = 2,460,672;
//	                  host 256 MiB + 807,680 + 3,145,728
//
// Each serves a streamed answer through the role and the ledger shows the
// charges; the fake llama-server holds on the simulated card what the
// card is charged.
func TestLlamaCpp_OffloadCharges(t *testing.T) {
	const overhead = 256 << 20
	cases := []struct {
		name         string
		noGPU        bool
		layers       string
		device, host int64
	}{
		{name: "cpu only on a card host", layers: "0", device: 0, host: overhead + 1_171_200 + 5_242_880},
		{name: "cpu only without a gpu", noGPU: true, layers: "0", device: 0, host: overhead + 1_171_200 + 5_242_880},
		{name: "two of five layers on the card", layers: "2", device: 363_520 + 2_097_152, host: overhead + 807_680 + 3_145_728},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r *harness.Role
			if c.noGPU {
				r = harness.StartStandalone(t, harness.Options{Args: []string{"--gpu-provider", "none",
					"--set", "memory.system.managed_limit=2GiB", "--set", "memory.system.free_reserve=512MiB"}})
			} else {
				// A 4 GiB card: the 8 GiB startup placeholder that once
				// ignored the offload cannot fit it.
				r = harness.StartSimulated(t, harness.SimGPU{DeviceMemory: "4GiB"}, harness.Options{})
			}
			r.AddLlamaServer("llamacpp")
			r.PutModel("stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
			r.MustDeployFile("stories", storiesLayersSpec(c.layers))

			st := e2e.Status(t, r, "stories")
			if st.State != "ready" {
				t.Fatalf("status %+v", st)
			}
			mv := e2e.MemoryOf(t, st)
			charged := map[string]int64{}
			for _, d := range mv.Ledger {
				charged[d.Name] = d.Charged
			}
			b, _ := json.Marshal(st.Memory)
			startup, _ := st.Memory["startup"].(map[string]any)
			if f, _ := startup["device_bytes"].(float64); charged["system"] != c.host || charged["gpu0"] != c.device || int64(f) != c.device {
				t.Fatalf("ledger %v, want system %d and gpu0 %d\nmemory %s", charged, c.host, c.device, b)
			}
			t.Logf("status deployment stories --json: memory %s", b)
			if !c.noGPU {
				var held int64
				for _, a := range r.SimState().Allocations {
					held += a.Bytes
				}
				if held != c.device {
					t.Fatalf("the fake llama-server holds %d bytes on the card, want %d", held, c.device)
				}
			}

			resp, err := r.Chat(context.Background(), harness.ChatBody("stories", true, "Once upon a time"), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := harness.ReadAll(resp)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "data: [DONE]") {
				t.Fatalf("chat %d %s", resp.StatusCode, body)
			}
			if out, errOut, code := r.CLI("stop", "deployment", "stories", "--wait"); code != 0 {
				t.Fatalf("stop: %d %s%s", code, out, errOut)
			}
			if !c.noGPU {
				harness.Eventually(t, 30*time.Second, "the card empty", func() bool { return len(r.SimState().Allocations) == 0 })
			}
		})
	}
}
