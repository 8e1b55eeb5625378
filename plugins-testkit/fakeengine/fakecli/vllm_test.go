// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"os"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// TestVLLM_FreeMemoryCheck: the fake vLLM, as vLLM, refuses to start when
// the card has less free than ceil(total × gpu_memory_utilization) (the
// default 0.92 when the option is absent), whatever
// --kv-cache-memory-bytes says, with vLLM's ValueError as its last line
// and exit 1; it starts when enough is free.
func TestVLLM_FreeMemoryCheck(t *testing.T) {
	cases := []struct {
		name    string
		util    []string
		starts  bool
		message string
	}{
		{name: "asks for more than is free", util: []string{"--gpu-memory-utilization", "0.6"},
			message: "ValueError: Free memory on device cuda:0 (4.00/8.00 GiB) on startup is less than desired GPU memory utilization (0.6, 4.80 GiB)"},
		{name: "the default asks for 0.92 of the card",
			message: "is less than desired GPU memory utilization (0.92, 7.36 GiB)"},
		{name: "asks for what is free", util: []string{"--gpu-memory-utilization", "0.5"}, starts: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			card := oneCard(t) // 8 GiB
			g, err := simgpu.Open(card)
			if err != nil {
				t.Fatal(err)
			}
			st, err := g.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			// Another process holds half the card.
			if err := g.Allocate(os.Getpid(), st.Devices[0].UUID, "other", 4<<30); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Free(os.Getpid(), "other") })
			args := append([]string{"-m", vllmModule, "--model", modelDir(t, 1<<20), "--served-model-name", "m", "--host", "127.0.0.1",
				"--port", "0", "--kv-cache-memory-bytes", "1048576"}, c.util...)
			p := startProc(t, "/venv/bin/python", args, "CAPYCTL_SIMGPU_STATE="+card, "VLLM_NO_USAGE_STATS=1")
			if !c.starts {
				p.exitsWith(t, 1, c.message)
				if got := heldOn(t, card, p.cmd.Process.Pid); len(got) != 0 {
					t.Fatalf("a refused start holds %v", got)
				}
				return
			}
			p.waitListening(t)
			p.waitFor(t, "ready", func() bool { s, _ := p.get("/health"); return s == 200 })
		})
	}
}
