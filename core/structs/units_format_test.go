// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"testing"
	"time"
)

func TestFormatDuration(t *testing.T) {
	cases := []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{120 * time.Second, "2m"},
		{90 * time.Second, "1m30s"},
		{10 * time.Minute, "10m"},
		{168 * time.Hour, "168h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + time.Second, "1h1s"},
		{1500 * time.Millisecond, "1.5s"},
		{250 * time.Millisecond, "250ms"},
		{-30 * time.Second, "-30s"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			got := FormatDuration(c.in)
			if got != c.want {
				t.Fatalf("FormatDuration(%v) = %q, want %q", c.in, got, c.want)
			}
			if c.in >= 0 {
				back, err := ParseDuration(got)
				if err != nil || back.D() != c.in {
					t.Fatalf("%q parses back as %v (%v)", got, back.D(), err)
				}
			}
		})
	}
}
