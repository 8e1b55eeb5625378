// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi_test

import (
	"testing"

	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
)

func TestNetnsBaseURL(t *testing.T) {
	a := engineapi.NetnsAddr{Engine: proc.Identity{PID: 4242, StartTicks: 977}, Port: 30001}
	base := engineapi.NetnsBaseURL(a)
	if base != "http+netns://4242.977.netns.invalid:30001" {
		t.Fatalf("NetnsBaseURL = %q", base)
	}
	if got, ok := engineapi.NetnsFromURL(base + "/v1"); !ok || got != a {
		t.Fatalf("NetnsFromURL = %+v, %v; want %+v", got, ok, a)
	}
	for _, bad := range []string{
		"http://4242.977.netns.invalid:30001", // not the scheme
		"http+netns://127.0.0.1:30001",        // no engine identity
		"http+netns://4242.netns.invalid:30001",
		"http+netns://1.977.netns.invalid:30001", // PID 1 is never an engine
		"http+netns://4242.977.netns.invalid:0",
		"http+netns://4242.977.netns.invalid",
		engineapi.UnixBaseURL("/run/x/engine.sock"),
	} {
		if got, ok := engineapi.NetnsFromURL(bad); ok {
			t.Errorf("NetnsFromURL(%q) = %+v, want refused", bad, got)
		}
	}
}
