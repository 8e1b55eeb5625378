// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package llamacpp

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestConformance runs the driver conformance suite against the llama.cpp
// driver as a real plugin (capyctl driver llamacpp), with the fake engine
// installed as llama-server and the real stories260K.gguf. llama.cpp is
// restart only: the suite skips the park steps (the plan's residency).
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Target{
		Family:     Family,
		Driver:     conformance.BuiltinDriver(Family),
		ExitStream: true,
		Install: func(t testing.TB, dir string) string {
			_, fake := harness.Binaries(t)
			p := filepath.Join(dir, "llama.cpp", "bin", "llama-server")
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(fake, p); err != nil {
				t.Fatal(err)
			}
			return p
		},
		Model: func(t testing.TB, dir string) string {
			m := filepath.Join(dir, "stories")
			if err := os.MkdirAll(m, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(storiesGGUF, filepath.Join(m, "stories260K.gguf")); err != nil {
				t.Fatal(err)
			}
			return m
		},
		Refusals: []conformance.Refusal{
			{Name: "api key on the command line", ExtraArgs: []string{"--api-key=x"}, Code: "engine_option_reserved:--api-key"},
			{Name: "an option from the environment", Env: map[string]string{"LLAMA_ARG_HOST": "0.0.0.0"}, Code: "engine_env_reserved:LLAMA_ARG_HOST"},
			{Name: "a download", ExtraArgs: []string{"--hf-repo", "org/model"}, Code: "engine_option_reserved:--hf-repo"},
			{Name: "unapproved adapter path", ExtraArgs: []string{"--lora", "/tmp/adapter.gguf"}, Code: "engine_option_not_approved:--lora"},
		},
	})
}
