// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package tensorfold

import (
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk"
)

// TestConformance runs the driver conformance suite against the TensorFold
// driver as a real plugin (capyctl driver tensorfold), with a fake venv
// whose bin/tensorfold is the fake engine and whose bin holds the build
// tools. TensorFold is restart only: the suite skips the park steps.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Target{
		Family:     Family,
		Driver:     conformance.BuiltinDriver(Family),
		ExitStream: true,
		Install: func(t testing.TB, dir string) string {
			_, fake := harness.Binaries(t)
			return harness.MakeTensorFoldVenv(t, filepath.Join(dir, "tensorfold"), fake, "0.6.6", true)
		},
		Deployment: func(modelDir string) *sdk.Deployment {
			return &sdk.Deployment{Name: "conformance", Revision: 1, API: "chat", ServedName: "conformance", ModelDir: modelDir,
				ContextLength: 8192, Resources: sdk.Resources{Declared: true, DeviceBytes: 20 << 30, HostBytes: 4 << 30}}
		},
		Refusals: []conformance.Refusal{
			{Name: "the key variable", Env: map[string]string{"TENSORFOLD_API_KEY": "x"}, Code: "engine_env_reserved:TENSORFOLD_API_KEY"},
			{Name: "the key option", ExtraArgs: []string{"--api-key", "x"}, Code: "engine_option_reserved:--api-key"},
			{Name: "open metrics", ExtraArgs: []string{"--metrics-open"}, Code: "engine_option_reserved:--metrics-open"},
			{Name: "the cap", Env: map[string]string{"TENSORFOLD_CUDA_MEMORY_LIMIT_GB": "80"}, Code: "engine_env_reserved:TENSORFOLD_CUDA_MEMORY_LIMIT_GB"},
		},
	})
}
