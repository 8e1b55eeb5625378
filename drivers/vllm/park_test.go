// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"testing"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// TestSleepLevel pins the park tiers to vLLM's sleep levels: deep is level
// 2 (weights and KV cache dropped, reloaded from disk on wake), host_backed
// is level 1 (weights kept in host RAM). Swapping them would park a
// host_backed model with no copy of its weights, or keep a deep one in RAM.
func TestSleepLevel(t *testing.T) {
	cases := []struct {
		tier  string
		level int
		code  string
	}{
		{tier: enginekit.ResidencyDeep, level: 2},
		{tier: enginekit.ResidencyHostBacked, level: 1},
		{tier: enginekit.ResidencyRestartOnly, code: sdk.CodeParkFailed},
		{tier: "", code: sdk.CodeParkFailed},
	}
	for _, c := range cases {
		t.Run(c.tier, func(t *testing.T) {
			level, err := sleepLevel(c.tier)
			if c.code != "" {
				if sdk.CodeOf(err) != c.code {
					t.Fatalf("sleepLevel(%q) = %d, %v; want code %s", c.tier, level, err, c.code)
				}
				return
			}
			if err != nil || level != c.level {
				t.Fatalf("sleepLevel(%q) = %d, %v; want level %d", c.tier, level, err, c.level)
			}
		})
	}
}
