// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"fmt"
	"testing"
)

// TestTargetCache_PerRouterAndBounded pins that parsed engine URLs belong to
// one Router (a second Router starts empty) and that the cache never holds
// more than maxTargets entries however many endpoints pass through it.
func TestTargetCache_PerRouterAndBounded(t *testing.T) {
	var a, b Router
	if _, err := a.targets.engineURL("http://127.0.0.1:9000", "/v1/chat/completions"); err != nil {
		t.Fatal(err)
	}
	if n := a.targets.len(); n != 1 {
		t.Fatalf("%d cached targets after one endpoint, want 1", n)
	}
	if n := b.targets.len(); n != 0 {
		t.Fatalf("a second router sees %d cached targets, want 0", n)
	}
	for i := 0; i < 3*maxTargets; i++ {
		base := fmt.Sprintf("http://127.0.0.1:%d", 10000+i)
		got, err := a.targets.engineURL(base, "/v1/chat/completions")
		if err != nil {
			t.Fatal(err)
		}
		again, err := a.targets.engineURL(base, "/v1/chat/completions")
		if err != nil || again != got {
			t.Fatalf("second lookup of %s: %v %v, want %v", base, again, err, got)
		}
		if n := a.targets.len(); n > maxTargets {
			t.Fatalf("cache holds %d targets after %d endpoints, bound %d", n, i+1, maxTargets)
		}
	}
}

// TestTargetCache_RefusesABadURLEveryTime: an endpoint the router cannot
// reach over plain HTTP is refused, the first time and every time after
// (a refusal is not cached as a target).
func TestTargetCache_RefusesABadURLEveryTime(t *testing.T) {
	var r Router
	for i := 0; i < 2; i++ {
		if _, err := r.targets.engineURL("https://127.0.0.1:9000", "/v1/chat/completions"); err == nil {
			t.Fatalf("lookup %d: an https engine endpoint was accepted", i)
		}
	}
	if n := r.targets.len(); n != 0 {
		t.Fatalf("%d targets cached after refusals", n)
	}
}
