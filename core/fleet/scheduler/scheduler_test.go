// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package scheduler

import (
	"reflect"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var three = []Host{{Name: "a", Free: 10, Ready: true}, {Name: "b", Free: 30, Ready: true}, {Name: "c", Free: 30, Ready: true}}

func TestCandidates(t *testing.T) {
	hosts := append(three, Host{Name: "d", Free: 99, Ready: false}, Host{Name: "e", Free: 99, Ready: true, Draining: true})
	cases := []struct {
		name    string
		allowed []string
		want    []string
	}{
		{"most free first, then by name; lost and draining left out", nil, []string{"b", "c", "a"}},
		{"placement.hosts narrows", []string{"a", "c", "e"}, []string{"c", "a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, h := range Candidates(hosts, c.allowed) {
				got = append(got, h.Name)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Candidates = %v, want %v", got, c.want)
			}
		})
	}
}

func TestSpread(t *testing.T) {
	cases := []struct {
		name string
		n    int
		want []Share
	}{
		{"one", 1, []Share{{"b", 1}}},
		{"one per host while hosts remain", 3, []Share{{"b", 1}, {"c", 1}, {"a", 1}}},
		{"then round again", 5, []Share{{"b", 2}, {"c", 2}, {"a", 1}}},
		{"none", 0, nil},
	}
	cands := Candidates(three, nil)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Spread(c.n, cands); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Spread(%d) = %v, want %v", c.n, got, c.want)
			}
		})
	}
}

func TestReassign(t *testing.T) {
	cands := Candidates(three, nil)
	shares, now := Reassign([]Share{{"b", 2}, {"c", 1}}, map[string]bool{"b": true}, cands, map[string]bool{"b": true, "c": true})
	if want := []Share{{"c", 1}, {"a", 1}}; !reflect.DeepEqual(shares, want) || !reflect.DeepEqual(now, []string{"a"}) {
		t.Fatalf("Reassign = %v (tried %v), want %v: one instance per untried host, the rest dropped", shares, now, want)
	}
	if Total(shares) != 2 {
		t.Fatalf("total %d", Total(shares))
	}
}

func TestResize(t *testing.T) {
	cands := Candidates(three, nil)
	cases := []struct {
		name   string
		shares []Share
		n      int
		want   []Share
	}{
		{"more go to new hosts first", []Share{{"b", 1}}, 3, []Share{{"b", 1}, {"c", 1}, {"a", 1}}},
		{"then round the hosts it has", []Share{{"b", 1}, {"c", 1}, {"a", 1}}, 4, []Share{{"b", 2}, {"c", 1}, {"a", 1}}},
		{"fewer come off the last hosts", []Share{{"b", 2}, {"c", 1}}, 1, []Share{{"b", 1}}},
		{"the same", []Share{{"b", 2}}, 2, []Share{{"b", 2}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Resize(c.shares, c.n, cands); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Resize = %v, want %v", got, c.want)
			}
		})
	}
}

func TestWithout(t *testing.T) {
	cands := Candidates(three, nil)
	got := Without([]Share{{"b", 1}, {"a", 1}}, "b", cands)
	if want := []Share{{"a", 1}, {"c", 1}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Without = %v, want %v: b's instance moves to a host without one", got, want)
	}
	if got := Without([]Share{{"b", 2}}, "b", []Host{{Name: "b", Ready: true}}); len(got) != 0 {
		t.Fatalf("Without on the only host = %v, want none", got)
	}
}

// TestReassign_TakesOnlyWhatIsPending: a refused share of one instance
// moves to one untried host, however many remain.
func TestReassign_TakesOnlyWhatIsPending(t *testing.T) {
	cands := Candidates(three, nil)
	shares, now := Reassign([]Share{{"b", 1}}, map[string]bool{"b": true}, cands, map[string]bool{"b": true})
	if want := []Share{{"c", 1}}; !reflect.DeepEqual(shares, want) || !reflect.DeepEqual(now, []string{"c"}) {
		t.Fatalf("Reassign = %v (tried %v), want %v: one host for the one pending instance", shares, now, want)
	}
}
