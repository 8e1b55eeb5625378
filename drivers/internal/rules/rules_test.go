// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package rules

import (
	"testing"

	"github.com/capyctl/capyctl/sdk/flags"
)

// TestTable: the family's options, then its variables, then the common
// variables, each row as its constructor says.
func TestTable(t *testing.T) {
	options := []flags.Rule{
		Owned("--port", "leased", "--listen-port"),
		OwnedBy("--ctx", "engine_config.context_length", "rendered"),
		Reserved("--api-key", "the key"),
		Gated("--lora", flags.ApprovePath, "adapters", "--lora-scaled"),
		Passed("--threads", "tuning"),
		Typed("--dtype", "engine_config.dtype", "typed"),
	}
	env := []flags.Rule{OwnedEnv("KEY", "the key"), ReservedEnv("X_*", "no")}
	tbl := Table("fam", options, env)
	if err := tbl.Validate(); err != nil {
		t.Fatal(err)
	}
	common := flags.CommonEnvRules()
	if tbl.Family != "fam" || len(tbl.Rules) != len(options)+len(env)+len(common) || tbl.Rules[len(options)].Name != "KEY" || tbl.Rules[len(options)+len(env)].Name != common[0].Name {
		t.Fatalf("table %+v", tbl)
	}
	want := []flags.Rule{
		{Name: "--port", Aliases: []string{"--listen-port"}, Kind: flags.Option, Class: flags.Owned, Reason: "leased"},
		{Name: "--ctx", Kind: flags.Option, Class: flags.Owned, Field: "engine_config.context_length", Reason: "rendered"},
		{Name: "--api-key", Kind: flags.Option, Class: flags.Reserved, Reason: "the key"},
		{Name: "--lora", Aliases: []string{"--lora-scaled"}, Kind: flags.Option, Class: flags.Gated, Approval: flags.ApprovePath, Reason: "adapters"},
		{Name: "--threads", Kind: flags.Option, Class: flags.Passed, Reason: "tuning"},
		{Name: "--dtype", Kind: flags.Option, Class: flags.Passed, Field: "engine_config.dtype", Reason: "typed"},
		{Name: "KEY", Kind: flags.Env, Class: flags.Owned, Reason: "the key"},
		{Name: "X_*", Kind: flags.Env, Class: flags.Reserved, Reason: "no"},
	}
	for i, w := range want {
		g := tbl.Rules[i]
		if g.Name != w.Name || g.Kind != w.Kind || g.Class != w.Class || g.Field != w.Field || g.Approval != w.Approval || g.Reason != w.Reason || len(g.Aliases) != len(w.Aliases) {
			t.Errorf("row %d = %+v, want %+v", i, g, w)
		}
	}
}
