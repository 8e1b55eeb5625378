// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"os"
	"testing"
)

// TestSoak runs the profile SOAK_PROFILE names (short when unset: what
// make test runs) with the seed SOAK_SEED gives (a fresh one when unset).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a role and its engines")
	}
	p, ok := ProfileNamed(os.Getenv(EnvProfile))
	if !ok {
		t.Fatalf("%s=%q: want short, long or fleet", EnvProfile, os.Getenv(EnvProfile))
	}
	seed, err := Seed()
	if err != nil {
		t.Fatalf("%s: %v", EnvSeed, err)
	}
	if p.Name == Fleet.Name {
		RunFleet(t, p, seed)
		return
	}
	Run(t, p, seed)
}
