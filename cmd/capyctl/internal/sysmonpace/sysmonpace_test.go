// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sysmonpace

import (
	"os"
	"strings"
	"testing"
)

func TestWithSetting_AddsItOnceAndLeavesAnOperatorsOwn(t *testing.T) {
	cases := []struct {
		in, want string
		add      bool
	}{
		{"", Setting, true},
		{"gctrace=1", "gctrace=1," + Setting, true},
		{"schedtrace=1000", "schedtrace=1000", false},
		{"gctrace=1, schedtrace=0", "gctrace=1, schedtrace=0", false},
		{Setting, Setting, false},
		{"xschedtrace=1", "xschedtrace=1," + Setting, true},
	}
	for _, c := range cases {
		got, add := withSetting(c.in)
		if got != c.want || add != c.add {
			t.Errorf("withSetting(%q) = %q, %v; want %q, %v", c.in, got, add, c.want, c.add)
		}
	}
}

func TestWants_OnlyTheCommandsThatRunARole(t *testing.T) {
	for args, want := range map[string]bool{
		"start standalone": true, "start server": true, "start host": true, "dev": true, "dev fleet": true,
		"start deployment x": false, "start instance x": false, "start": false,
		"status": false, "driver custom": false, "": false,
	} {
		a := append([]string{"capyctl"}, strings.Fields(args)...)
		if got := Wants(a); got != want {
			t.Errorf("Wants(%q) = %v, want %v", a, got, want)
		}
	}
}

func TestRestore_PutsGODEBUGBackAsItWas(t *testing.T) {
	t.Setenv("GODEBUG", "gctrace=1,"+Setting)
	t.Setenv(origEnv, "gctrace=1")
	if !restore() {
		t.Fatal("restore found no marker")
	}
	if got := os.Getenv("GODEBUG"); got != "gctrace=1" {
		t.Fatalf("GODEBUG = %q after restore", got)
	}
	if _, ok := os.LookupEnv(origEnv); ok {
		t.Fatal("the marker is still set: the role's children would inherit it")
	}
	// Unset before: unset after.
	t.Setenv("GODEBUG", Setting)
	t.Setenv(origEnv, "-")
	restore()
	if v, ok := os.LookupEnv("GODEBUG"); ok {
		t.Fatalf("GODEBUG = %q, want it unset as it was", v)
	}
	if restore() {
		t.Fatal("a second restore found a marker")
	}
}

func TestReexecEnv_OneGODEBUGAndOneMarker(t *testing.T) {
	env, ok := reexecEnv([]string{"PATH=/bin", "GODEBUG=gctrace=1", "GODEBUG=madvdontneed=1", origEnv + "=stale"})
	if !ok {
		t.Fatal("no re-execution for a GODEBUG without schedtrace")
	}
	want := []string{"PATH=/bin", "GODEBUG=gctrace=1," + Setting, origEnv + "=gctrace=1"}
	if strings.Join(env, "\n") != strings.Join(want, "\n") {
		t.Fatalf("env = %q, want %q", env, want)
	}
	env, _ = reexecEnv([]string{"PATH=/bin"})
	if want := []string{"PATH=/bin", "GODEBUG=" + Setting, origEnv + "=-"}; strings.Join(env, "\n") != strings.Join(want, "\n") {
		t.Fatalf("env = %q, want %q", env, want)
	}
	if _, ok := reexecEnv([]string{"GODEBUG=schedtrace=0"}); ok {
		t.Fatal("an operator's schedtrace=0 was overridden")
	}
}

func TestRestore_IgnoresAStaleMarker(t *testing.T) {
	t.Setenv("GODEBUG", "gctrace=1")
	t.Setenv(origEnv, "-")
	if restore() {
		t.Fatal("a marker beside a GODEBUG Settle did not make was taken for a re-execution")
	}
	if got := os.Getenv("GODEBUG"); got != "gctrace=1" {
		t.Fatalf("the operator's GODEBUG became %q", got)
	}
	if _, ok := os.LookupEnv(origEnv); ok {
		t.Fatal("the stale marker is still set")
	}
}
