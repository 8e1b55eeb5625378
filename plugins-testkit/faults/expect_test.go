// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"strings"
	"testing"
)

func TestFailures(t *testing.T) {
	out := Outcomes{
		Requests: map[string]int{"ok": 10, "503 unavailable": 2, "connection refused": 3, "503 -": 1},
		Streams:  map[string]int{"ok": 4, "stream error engine_error": 5, "stream cut": 1},
	}
	cases := []struct {
		name    string
		allowed func(string) bool
		want    []string // the failures listed
	}{
		{"none allowed", func(string) bool { return false },
			[]string{"requests 3× connection refused", "requests 2× 503 unavailable", "requests 1× 503 -", "streams 5× stream error engine_error", "streams 1× stream cut"}},
		{"coded", coded, []string{"requests 3× connection refused", "requests 1× 503 -", "streams 1× stream cut"}},
		{"lost connections", connectionLost, []string{"requests 2× 503 unavailable", "requests 1× 503 -", "streams 5× stream error engine_error"}},
		{"codes named", anyOf(connectionLost, codedAs("engine_error")), []string{"requests 2× 503 unavailable", "requests 1× 503 -"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := failures(out, c.allowed)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("failures %q lack %q", got, w)
				}
			}
			if n := strings.Count(got, "×"); n != len(c.want) {
				t.Errorf("failures %q list %d, want %d", got, n, len(c.want))
			}
		})
	}
	if got := failures(Outcomes{Requests: map[string]int{"ok": 3}}, coded); got != "" {
		t.Fatalf("all ok: %q", got)
	}
}
