// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"testing"

	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/proc"
)

// TestNilParts: the kit's helpers take a nil for an absent part of a request
// (no host policy, no launch context, no launch, no group), as they did
// when the parts were protobuf messages read through nil-safe getters, so a
// driver written then does not panic now.
func TestNilParts(t *testing.T) {
	cases := []struct {
		name string
		call func() any
		want any
	}{
		{"Describe without capabilities", func() any { return Describe("f", "1", nil, "").Name }, "f"},
		{"TelemetryOff without a policy", func() any { return TelemetryOff(nil) }, true},
		{"LogMode without a policy", func() any { return LogMode(nil) }, proc.LogModeFile},
		{"HostApprovals without a policy", func() any { return len(flags.HostApprovals(nil).Options) }, 0},
		{"SocketPath without a launch context", func() any { p, _ := SocketPath(nil); return p != "" }, true},
		{"PinDevices without a launch context", func() any { e := NewEnv("/bin"); e.PinDevices(nil); return len(e) }, 2},
		{"FromLaunch without a launch", func() any { return FromLaunch(nil).Pgid }, 0},
		{"StopLMCacheServer without a record", func() any { return StopLMCacheServer(nil).Gone }, true},
		{"Idle without a reading", func() any { return Idle(nil) }, false},
		{"GroupShare without a group", func() any { return GroupShare(10, nil) }, int64(10)},
		{"GroupWorker without a group", func() any { return GroupWorker(nil) }, false},
		{"NewInstance without an endpoint", func() any { return NewInstance("a/0", "l", proc.Launched{}, 1, nil).ServedName }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.call(); got != c.want {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}
