// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestWriteDefault(t *testing.T) {
	for _, role := range Roles {
		t.Run(role, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteDefault(role, &buf); err != nil {
				t.Fatal(err)
			}
			for _, d := range Definitions() {
				listed := strings.Contains(buf.String(), "(env "+d.Env+")") || strings.Contains(buf.String(), "(env "+d.Env+";")
				if listed != d.AppliesTo(role) {
					t.Errorf("setting %s: listed = %v, but applies to %s = %v", d.Path, listed, role, d.AppliesTo(role))
				}
			}
			path := writeFile(t, role+".hcl", buf.String())
			c, err := Load(LoadOptions{File: path, Env: []string{"HOME=/h"}})
			if err != nil {
				t.Fatalf("Load of the written file: %v", err)
			}
			if c.Role != role {
				t.Errorf("role = %q", c.Role)
			}
			for p, src := range c.Provenance() {
				want := FromDefault
				if p == "role" {
					want = FromFile
				}
				if src.From != want {
					t.Errorf("%s comes from %s, want %s", p, src.From, want)
				}
			}
		})
	}
	if err := WriteDefault("client", &bytes.Buffer{}); err == nil {
		t.Error("unknown role accepted")
	}
}

// commented matches a commented-out setting line of the default file.
var commented = regexp.MustCompile(`(?m)^(\s*)# ([a-z_]+ = .*)$`)

// TestWriteDefault_Uncommented uncomments every setting: each commented
// value must be valid and (where the default is not derived) equal to the
// default.
func TestWriteDefault_Uncommented(t *testing.T) {
	for _, role := range Roles {
		t.Run(role, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteDefault(role, &buf); err != nil {
				t.Fatal(err)
			}
			src := commented.ReplaceAllString(buf.String(), "$1$2")
			path := writeFile(t, role+".hcl", src)
			c, err := Load(LoadOptions{File: path, Env: []string{"HOME=/h"}})
			if err != nil {
				t.Fatalf("Load of the uncommented file: %v\n%s", err, src)
			}
			defaults, err := Load(LoadOptions{Env: []string{"HOME=/h"}, Flags: map[string]string{"role": role}})
			if err != nil {
				t.Fatal(err)
			}
			dp := defaults.Provenance()
			for _, d := range Definitions() {
				got := c.Provenance()[d.Path]
				if !d.AppliesTo(role) {
					continue
				}
				if got.From != FromFile {
					t.Errorf("%s comes from %s, want file", d.Path, got.From)
				}
				if d.computed == nil && got.Value != dp[d.Path].Value {
					t.Errorf("%s = %q uncommented, default %q", d.Path, got.Value, dp[d.Path].Value)
				}
			}
		})
	}
}
