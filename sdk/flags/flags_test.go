// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package flags

import (
	"strings"
	"testing"

	"github.com/capyctl/capyctl/sdk"
)

// testTable is a small family with every kind of row.
func testTable() *Table {
	return &Table{Family: "test", Rules: append([]Rule{
		{Name: "--port", Kind: Option, Class: Owned, Reason: "the leased port"},
		{Name: "--max-num-seqs", Kind: Option, Class: Owned, Reason: "from max_concurrent_requests"},
		{Name: "--enable-sleep-mode", Kind: Option, Class: Owned, Reason: "parking"},
		{Name: "--api-key", Kind: Option, Class: Reserved, Reason: "the key goes through the environment"},
		{Name: "--tp-size", Aliases: []string{"--tp", "--tensor-parallel-size"}, Kind: Option, Class: Reserved, Reason: "one card per instance"},
		{Name: "--logging-config", Kind: Option, Class: Reserved, Reason: "logging"},
		{Name: "--debug-tensor-dump-*", Kind: Option, Class: Reserved, Reason: "dumps to disk"},
		{Name: "--*-config", Kind: Option, Class: Gated, Approval: ApproveOption, Reason: "a configuration object"},
		{Name: "--*-path", Kind: Option, Class: Gated, Approval: ApprovePath, Reason: "a path"},
		{Name: "--download-dir", Kind: Option, Class: Gated, Approval: ApprovePath, Reason: "a path"},
		{Name: "--trust-remote-code", Kind: Option, Class: Gated, Approval: ApproveRemoteCode, Reason: "remote code"},
		{Name: "--dtype", Kind: Option, Class: Passed, Reason: "typed", Field: "engine_config.dtype"},
		{Name: "--max-model-len", Kind: Option, Class: Passed, Reason: "typed", Field: "engine_config.context_length"},
		{Name: "VLLM_API_KEY", Kind: Env, Class: Reserved, Reason: "the per-launch key"},
		{Name: "SGLANG_DUMP*", Kind: Env, Class: Reserved, Reason: "dumps to disk"},
	}, CommonEnvRules()...)}
}

func TestTable_Validate(t *testing.T) {
	if err := testTable().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		rule Rule
		want string
	}{
		{name: "no reason", rule: Rule{Name: "--x", Kind: Option, Class: Passed}, want: "no reason"},
		{name: "gated without approval", rule: Rule{Name: "--x", Kind: Option, Class: Gated, Reason: "r"}, want: "names no approval"},
		{name: "approval on a reserved rule", rule: Rule{Name: "--x", Kind: Option, Class: Reserved, Approval: ApproveOption, Reason: "r"}, want: "names an approval"},
		{name: "option without dashes", rule: Rule{Name: "x", Kind: Option, Class: Passed, Reason: "r"}, want: "must start with --"},
		{name: "duplicate", rule: Rule{Name: "--api-key", Kind: Option, Class: Passed, Reason: "r"}, want: "listed twice"},
		{name: "unknown approval", rule: Rule{Name: "--x", Kind: Option, Class: Gated, Approval: "magic", Reason: "r"}, want: "unknown approval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := testTable()
			tb.Rules = append(tb.Rules, c.rule)
			err := tb.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %v, want %q", err, c.want)
			}
		})
	}
}

func TestTable_ResolveOption(t *testing.T) {
	tb := testTable()
	cases := []struct {
		name      string
		tok       string
		wantRule  string
		wantClass Class
		wantHow   string
	}{
		{name: "exact", tok: "--api-key", wantRule: "--api-key", wantClass: Reserved, wantHow: "exact"},
		{name: "with a value", tok: "--api-key=secret", wantRule: "--api-key", wantClass: Reserved, wantHow: "exact"},
		{name: "underscores", tok: "--api_key", wantRule: "--api-key", wantClass: Reserved, wantHow: "exact"},
		{name: "alias", tok: "--tensor-parallel-size=2", wantRule: "--tp-size", wantClass: Reserved, wantHow: "exact"},
		{name: "abbreviation of a reserved option", tok: "--api-k", wantRule: "--api-key", wantClass: Reserved, wantHow: "abbreviation"},
		{name: "abbreviation of an owned option", tok: "--max-num", wantRule: "--max-num-seqs", wantClass: Owned, wantHow: "abbreviation"},
		{name: "ambiguous abbreviation takes the strictest", tok: "--t", wantRule: "--tp-size", wantClass: Reserved, wantHow: "abbreviation"},
		{name: "dotted json field", tok: "--logging-config.level=DEBUG", wantRule: "--logging-config", wantClass: Reserved, wantHow: "exact"},
		{name: "negation", tok: "--no-enable-sleep-mode", wantRule: "--enable-sleep-mode", wantClass: Owned, wantHow: "negation"},
		{name: "prefix pattern", tok: "--debug-tensor-dump-output-folder=/x", wantRule: "--debug-tensor-dump-*", wantClass: Reserved, wantHow: "pattern"},
		{name: "abbreviation of a prefix pattern", tok: "--debug-tensor", wantRule: "--debug-tensor-dump-*", wantClass: Reserved, wantHow: "abbreviation"},
		{name: "suffix pattern", tok: "--watermark-config", wantRule: "--*-config", wantClass: Gated, wantHow: "pattern"},
		{name: "exact beats a pattern", tok: "--logging-config", wantRule: "--logging-config", wantClass: Reserved, wantHow: "exact"},
		{name: "path pattern", tok: "--speculative-draft-model-path", wantRule: "--*-path", wantClass: Gated, wantHow: "pattern"},
		{name: "passed typed option", tok: "--max-model-len", wantRule: "--max-model-len", wantClass: Passed, wantHow: "exact"},
		{name: "unknown option", tok: "--enable-prefix-caching", wantClass: Passed},
		{name: "unknown negation", tok: "--no-enable-prefix-caching", wantClass: Passed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := tb.ResolveOption(c.tok)
			got := ""
			if m.Rule != nil {
				got = m.Rule.Name
			}
			if got != c.wantRule || m.Class(Option) != c.wantClass || m.How != c.wantHow {
				t.Fatalf("ResolveOption(%q) = rule %q class %s how %q, want %q %s %q", c.tok, got, m.Class(Option), m.How, c.wantRule, c.wantClass, c.wantHow)
			}
		})
	}
}

func TestTable_CheckArgs(t *testing.T) {
	tb := testTable()
	ap := Approvals{Options: []string{"speculative-config"}, Paths: []string{"/models/drafts"}, RemoteCode: false}
	cases := []struct {
		name  string
		args  []string
		typed map[string]bool
		ap    *Approvals
		want  []string // codes, in order
	}{
		{name: "nothing", args: nil},
		{name: "passed options and values", args: []string{"--enable-prefix-caching", "--max-model-len", "4096", "--chunked-prefill-size", "-1"}},
		{name: "reserved", args: []string{"--api-key", "k"}, want: []string{"engine_option_reserved:--api-key"}},
		{name: "reserved with equals", args: []string{"--api-key=k"}, want: []string{"engine_option_reserved:--api-key"}},
		{name: "reserved abbreviation", args: []string{"--api=k"}, want: []string{"engine_option_reserved:--api-key"}},
		{name: "reserved underscore", args: []string{"--tensor_parallel_size", "2"}, want: []string{"engine_option_reserved:--tp-size"}},
		{name: "owned", args: []string{"--port", "1"}, want: []string{"engine_option_owned:--port"}},
		{name: "owned negation", args: []string{"--no-enable-sleep-mode"}, want: []string{"engine_option_owned:--enable-sleep-mode"}},
		{name: "short option", args: []string{"-tp", "2"}, want: []string{"engine_option_reserved:-tp"}},
		{name: "positional first", args: []string{"model-dir", "--dtype", "auto"}, want: []string{"invalid_config"}},
		{name: "double dash", args: []string{"--"}, want: []string{"invalid_config"}},
		{name: "gated option approved", args: []string{"--speculative-config", `{"method":"ngram"}`}},
		{name: "gated option approved with dashes", args: []string{"--speculative-config={}"}, ap: &Approvals{Options: []string{"--speculative-config"}}},
		{name: "gated option not approved", args: []string{"--watermark-config", "{}"}, want: []string{"engine_option_not_approved:--watermark-config"}},
		{name: "path approved", args: []string{"--speculative-draft-model-path", "/models/drafts/small"}},
		{name: "path outside", args: []string{"--download-dir", "/tmp/elsewhere"}, want: []string{"engine_option_not_approved:--download-dir"}},
		{name: "path escaping with dots", args: []string{"--download-dir=/models/drafts/../../etc"}, want: []string{"engine_option_not_approved:--download-dir"}},
		{name: "relative path", args: []string{"--download-dir", "drafts"}, want: []string{"engine_option_not_approved:--download-dir"}},
		{name: "path without value", args: []string{"--download-dir"}, want: []string{"engine_option_not_approved:--download-dir"}},
		{name: "remote code without permission", args: []string{"--trust-remote-code"}, want: []string{"remote_code_not_allowed"}},
		{name: "remote code allowed", args: []string{"--trust-remote-code"}, ap: &Approvals{RemoteCode: true}},
		{name: "typed field set twice", args: []string{"--dtype", "float16"}, typed: map[string]bool{"engine_config.dtype": true}, want: []string{"engine_option_owned:--dtype"}},
		{name: "typed field unset", args: []string{"--dtype", "float16"}},
		{name: "several", args: []string{"--api-key", "k", "--port=2", "--enable-prefix-caching"}, want: []string{"engine_option_reserved:--api-key", "engine_option_owned:--port"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := ap
			if c.ap != nil {
				a = *c.ap
			}
			_, vs := tb.CheckArgs(c.args, a, c.typed)
			var got []string
			for _, v := range vs {
				got = append(got, v.Code)
				if v.Field != FieldExtraArgs || v.Message == "" {
					t.Errorf("violation %+v lacks field or message", v)
				}
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Fatalf("CheckArgs(%q) = %v, want %v", c.args, got, c.want)
			}
		})
	}
}

func TestTable_CheckArgsMessageNamesSpelling(t *testing.T) {
	_, vs := testTable().CheckArgs([]string{"--api_k=x"}, Approvals{}, nil)
	if len(vs) != 1 || !strings.Contains(vs[0].Message, "--api-key") || !strings.Contains(vs[0].Message, "--api_k") {
		t.Fatalf("violations %+v: want the option and the spelling named", vs)
	}
}

func TestTable_CheckEnv(t *testing.T) {
	tb := testTable()
	ap := Approvals{Env: []string{"VLLM_LOGGING_*", "MY_VAR"}}
	cases := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{name: "nothing"},
		{name: "approved glob", env: map[string]string{"VLLM_LOGGING_LEVEL": "INFO"}},
		{name: "passed without approval", env: map[string]string{"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}},
		{name: "not approved", env: map[string]string{"OTHER": "1"}, want: []string{"engine_env_not_approved:OTHER"}},
		{name: "reserved exact", env: map[string]string{"VLLM_API_KEY": "k"}, want: []string{"engine_env_reserved:VLLM_API_KEY"}},
		{name: "owned", env: map[string]string{"DO_NOT_TRACK": "0"}, want: []string{"engine_env_reserved:DO_NOT_TRACK"}},
		{name: "reserved pattern", env: map[string]string{"SGLANG_DUMP_DIR": "/tmp"}, want: []string{"engine_env_reserved:SGLANG_DUMP_DIR"}},
		{name: "interpreter variable", env: map[string]string{"PYTHONPATH": "/x"}, want: []string{"engine_env_reserved:PYTHONPATH"}},
		{name: "loader variable", env: map[string]string{"LD_PRELOAD": "/x.so"}, want: []string{"engine_env_reserved:LD_PRELOAD"}},
		{name: "bad name", env: map[string]string{"1BAD": "x"}, want: []string{"invalid_config"}},
		{name: "long value", env: map[string]string{"MY_VAR": strings.Repeat("x", MaxEnvValueBytes+1)}, want: []string{"invalid_config"}},
		{name: "sorted", env: map[string]string{"B_VAR": "1", "A_VAR": "1"}, want: []string{"engine_env_not_approved:A_VAR", "engine_env_not_approved:B_VAR"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, v := range tb.CheckEnv(c.env, ap) {
				got = append(got, v.Code)
				if v.Field != FieldEnv {
					t.Errorf("violation %+v has field %q", v, v.Field)
				}
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Fatalf("CheckEnv = %v, want %v", got, c.want)
			}
		})
	}
	many := map[string]string{}
	for i := 0; i <= MaxEnvNames; i++ {
		many["TOKENIZERS_PARALLELISM"+strings.Repeat("X", i)] = "1"
	}
	vs := tb.CheckEnv(many, Approvals{Env: []string{"*"}})
	if len(vs) != 1 || vs[0].Code != CodeInvalidConfig {
		t.Fatalf("65 names: %+v", vs)
	}
}

func TestTable_Proto(t *testing.T) {
	p := testTable().Response()
	if p.Family != "test" || len(p.Rules) != len(testTable().Rules) {
		t.Fatalf("proto: %v", p)
	}
	var sawGated bool
	for _, r := range p.Rules {
		if r.Class == sdk.FlagClassUnspecified || r.Kind == sdk.FlagKindUnspecified || r.Reason == "" {
			t.Fatalf("rule %v incomplete", r)
		}
		if r.Name == "--*-config" {
			sawGated = r.Class == sdk.FlagClassGated && r.Approval == ApproveOption
		}
	}
	if !sawGated {
		t.Fatal("gated rule lost its approval")
	}
}

func TestFind(t *testing.T) {
	tb := testTable()
	args, _ := tb.SplitArgs([]string{"--tensor-parallel-size", "2", "--tool-call-parser", "hermes"})
	if a := Find(args, "--tp-size"); a == nil || a.Values[0] != "2" {
		t.Fatalf("Find by alias: %+v", a)
	}
	if a := Find(args, "--tool-call-parser"); a == nil || a.Values[0] != "hermes" {
		t.Fatalf("Find unknown option: %+v", a)
	}
	if a := Find(args, "--reasoning-parser"); a != nil {
		t.Fatalf("Find absent: %+v", a)
	}
}

func TestWildcard(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"--*-path", "--model-path", true},
		{"--*-path", "--path", false},
		{"--*-path", "--model-paths", false},
		{"SGLANG_DUMP*", "SGLANG_DUMP", true},
		{"SGLANG_DUMP*", "SGLANG_DUMPER_X", true},
		{"SGLANG_DUMP*", "XSGLANG_DUMP", false},
		{"A*B*C", "AxxBxxC", true},
		{"A*B*C", "AxxC", false},
		{"--x", "--x", true},
	}
	for _, c := range cases {
		if got := wildcard(c.pattern, c.name); got != c.want {
			t.Errorf("wildcard(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

// TestNames: the names `capyctl engine flags` prints for what a driver
// sends on the wire.
func TestNames(t *testing.T) {
	for _, c := range []Class{Owned, Reserved, Gated, Passed} {
		if got := ClassName(c.FlagClass()); got != c.String() {
			t.Errorf("ClassName(%v) = %q, want %q", c.FlagClass(), got, c.String())
		}
	}
	if got := ClassName(sdk.FlagClassUnspecified); got != "unknown" {
		t.Errorf("unspecified class = %q", got)
	}
	cases := []struct {
		kind sdk.FlagKind
		want string
	}{{Option.FlagKind(), "option"}, {Env.FlagKind(), "env"}, {sdk.FlagKind(99), "unknown"}}
	for _, c := range cases {
		if got := KindName(c.kind); got != c.want {
			t.Errorf("KindName(%v) = %q, want %q", c.kind, got, c.want)
		}
	}
}
