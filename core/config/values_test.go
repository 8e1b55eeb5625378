// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func TestParseAmount(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    Amount
		str     string
		resolve int64 // of a 100 GiB capacity with auto = 50%
		wantErr bool
	}{
		{name: "auto", in: "auto", want: Amount{Auto: true}, str: "auto", resolve: 50 * structs.GiB},
		{name: "size", in: "90GiB", want: Amount{Bytes: structs.ByteSize(90 * structs.GiB)}, str: "90GiB", resolve: 90 * structs.GiB},
		{name: "percentage", in: "75%", want: Amount{Percent: 75}, str: "75%", resolve: 75 * structs.GiB},
		{name: "fractional percentage", in: "12.5 %", want: Amount{Percent: 12.5}, str: "12.5%", resolve: 12*structs.GiB + 512*structs.MiB},
		{name: "100%", in: "100%", want: Amount{Percent: 100}, str: "100%", resolve: 100 * structs.GiB},
		{name: "over 100%", in: "101%", wantErr: true},
		{name: "zero percent", in: "0%", wantErr: true},
		{name: "negative percent", in: "-5%", wantErr: true},
		{name: "zero size", in: "0GiB", wantErr: true},
		{name: "junk", in: "plenty", wantErr: true},
		{name: "bad percent", in: "x%", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseAmount(c.in)
			if c.wantErr {
				if err == nil {
					t.Fatalf("ParseAmount(%q) = %+v, want an error", c.in, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want || got.String() != c.str {
				t.Errorf("ParseAmount(%q) = %+v (%s), want %+v (%s)", c.in, got, got, c.want, c.str)
			}
			if r := got.Resolve(100*structs.GiB, 50); r != c.resolve {
				t.Errorf("Resolve = %d, want %d", r, c.resolve)
			}
		})
	}
}

func TestParsePortRange(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    PortRange
		wantErr bool
	}{
		{name: "range", in: "8100-8199", want: PortRange{8100, 8199}},
		{name: "one port", in: "9000", want: PortRange{9000, 9000}},
		{name: "spaces", in: " 8100 - 8101 ", want: PortRange{8100, 8101}},
		{name: "reversed", in: "8199-8100", wantErr: true},
		{name: "privileged", in: "80-90", wantErr: true},
		{name: "too high", in: "65000-70000", wantErr: true},
		{name: "junk", in: "a-b", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParsePortRange(c.in)
			if c.wantErr {
				if err == nil {
					t.Fatalf("ParsePortRange(%q) = %v, want an error", c.in, got)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("ParsePortRange(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
			if !got.Contains(c.want.First) || got.Contains(c.want.Last+1) || got.Len() != c.want.Last-c.want.First+1 {
				t.Errorf("Contains/Len wrong for %v", got)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		{name: "hours", in: "168h", want: 168 * time.Hour},
		{name: "days", in: "7d", want: 7 * 24 * time.Hour},
		{name: "days and hours", in: "1d12h", want: 36 * time.Hour},
		{name: "seconds", in: "30s", want: 30 * time.Second},
		{name: "bad days", in: "xd", wantErr: true},
		{name: "negative", in: "-1h", wantErr: true},
		{name: "no unit", in: "30", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseDuration(c.in)
			if c.wantErr {
				if err == nil {
					t.Fatalf("parseDuration(%q) = %v, want an error", c.in, got)
				}
				return
			}
			if err != nil || got.D() != c.want {
				t.Errorf("parseDuration(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
		})
	}
}
