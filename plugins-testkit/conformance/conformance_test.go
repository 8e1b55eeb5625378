// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

func TestConformance_VLLM(t *testing.T) {
	conformance.Run(t, conformance.Target{
		Family:     "vllm",
		Driver:     conformance.BuiltinDriver("vllm"),
		ExitStream: true,
		Install: func(t testing.TB, dir string) string {
			return conformance.FakeVenv(t, dir, map[string]string{"vllm": "0.31.0", "torch": "2.9.0"}, nil)
		},
		Refusals: []conformance.Refusal{
			{Name: "api key on the command line", ExtraArgs: []string{"--api-key=x"}, Code: "engine_option_reserved:--api-key"},
			{Name: "logging configuration", ExtraArgs: []string{"--logging-config.level", "DEBUG"}, Code: "engine_option_reserved:--logging-config"},
			{Name: "usage stats", Env: map[string]string{"VLLM_NO_USAGE_STATS": "0"}, Code: "engine_env_reserved:VLLM_NO_USAGE_STATS"},
			{Name: "unapproved path", ExtraArgs: []string{"--download-dir", "/tmp/elsewhere"}, Code: "engine_option_not_approved:--download-dir"},
		},
	})
}

func TestConformance_SGLang(t *testing.T) {
	conformance.Run(t, conformance.Target{
		Family:     "sglang",
		Driver:     conformance.BuiltinDriver("sglang"),
		ExitStream: true,
		// No socket option: as root, a network namespace of its own.
		IsolatedAsRoot: true,
		Install: func(t testing.TB, dir string) string {
			return conformance.FakeVenv(t, dir, map[string]string{"sglang": "0.5.22", "smg-grpc-servicer": "0.3.0"}, map[string]string{
				// SGLang 0.5.22 installs plugins of its own: none may load.
				"smg-grpc-servicer-0.3.0.dist-info/entry_points.txt": "[sglang.srt.plugins]\nsmg = smg_grpc_servicer:register\n",
			})
		},
		Refusals: []conformance.Refusal{
			{Name: "dump option", ExtraArgs: []string{"--debug-tensor-dump-output-folder", "/tmp/d"}, Code: "engine_option_reserved:--debug-tensor-dump-output-folder"},
			{Name: "dump variable", Env: map[string]string{"SGLANG_DUMPER_DIR": "/tmp"}, Code: "engine_env_reserved:SGLANG_DUMPER_DIR"},
			{Name: "plugin selection", Env: map[string]string{"SGLANG_PLUGINS": "smg"}, Code: "engine_env_reserved:SGLANG_PLUGINS"},
		},
		Failures: []conformance.Failure{{
			Name: "scheduler dies while loading",
			Env:  map[string]string{fakeengine.EnvName("scheduler-exit-during-startup"): "1"},
			Check: func(t *testing.T, launch *sdk.Launch) {
				// The driver ended the hung server and removed the segment
				// it left.
				if left := proc.GroupPIDs(int(launch.Pgid)); len(left) > 0 {
					t.Fatalf("processes left after the scheduler died: %v", left)
				}
				for _, p := range launch.Processes {
					if segs := conformance.ShmSegmentsOf(int(p.Pid)); len(segs) > 0 {
						t.Fatalf("shared memory left behind: %v", segs)
					}
				}
			},
		}},
	})
}
