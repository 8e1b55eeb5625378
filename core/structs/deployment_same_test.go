// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import "testing"

func TestSameSpec(t *testing.T) {
	base := func() *Deployment {
		return &Deployment{Name: "chat", Engine: "vllm", API: "chat", Routes: []string{"chat"}, Instances: 1,
			Model: ModelSpec{Path: "chat"}, Source: "a.hcl:1", Provenance: map[string]string{"api": "default"}}
	}
	cases := []struct {
		name   string
		change func(d *Deployment)
		same   bool
	}{
		{name: "identical", change: func(*Deployment) {}, same: true},
		{name: "another file and line", change: func(d *Deployment) { d.Source = "b.hcl:9" }, same: true},
		{name: "a default written out", change: func(d *Deployment) { d.Provenance = map[string]string{"api": "file"} }, same: true},
		{name: "a group member set by a server", change: func(d *Deployment) { d.Group = &GroupMember{Rank: 1} }, same: true},
		{name: "another engine", change: func(d *Deployment) { d.Engine = "sglang" }, same: false},
		{name: "another route", change: func(d *Deployment) { d.Routes = []string{"chat", "chat2"} }, same: false},
		{name: "another deadline", change: func(d *Deployment) { d.RequestDeadline = Duration(90e9) }, same: false},
		{name: "an engine option", change: func(d *Deployment) { d.EngineConfig.MaxConcurrentRequests = 8 }, same: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := base(), base()
			c.change(b)
			if got := SameSpec(a, b); got != c.same {
				t.Fatalf("SameSpec = %v, want %v", got, c.same)
			}
			if a.Source != "a.hcl:1" || a.Provenance["api"] != "default" {
				t.Fatal("SameSpec changed its argument")
			}
		})
	}
	if !SameSpec(nil, nil) || SameSpec(base(), nil) {
		t.Fatal("nil specs")
	}
}
