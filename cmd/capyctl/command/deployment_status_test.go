// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

func TestExposureLine(t *testing.T) {
	cases := []struct {
		name string
		in   structs.Exposure
		want string
	}{
		{"socket", structs.Exposure{Listener: "unix"}, "unix socket in the launch directory (only the role's user)"},
		{"network namespace", structs.Exposure{Listener: "netns", Note: "network namespace of its own: only the role's user reaches it"},
			"network namespace of its own (only the role's user)"},
		{"no key", structs.Exposure{Listener: "tcp", OpenRoutes: []string{"*"}}, "loopback TCP: every route answers any local user"},
		{"open routes", structs.Exposure{Listener: "tcp", OpenRoutes: []string{"/health", "/sleep"}, Note: "vLLM 0.10.2 predates --uds"},
			"loopback TCP: /health, /sleep answer any local user without the key (vLLM 0.10.2 predates --uds)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := exposureLine(&c.in); got != c.want {
				t.Fatalf("exposureLine = %q, want %q", got, c.want)
			}
		})
	}
}
