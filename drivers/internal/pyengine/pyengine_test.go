// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
)

func TestVersionIn(t *testing.T) {
	cases := []struct {
		version  string
		prefixes []string
		want     bool
	}{
		{"0.31.0", []string{"0.29", "0.30", "0.31", "0.32"}, true},
		{"0.32.1.post1", []string{"0.32"}, true},
		{"0.31.0+cu128", []string{"0.31"}, true},
		{"0.33.0", []string{"0.29", "0.32"}, false},
		{"0.3.1", []string{"0.31"}, false},
		{"0.5.22.post1", []string{"0.5.20", "0.5.21", "0.5.22"}, true},
		{"0.5.2", []string{"0.5.22"}, false},
		{"0.5.23", []string{"0.5.22"}, false},
		{"garbage", []string{"0.5"}, false},
	}
	for _, c := range cases {
		if got := VersionIn(c.version, c.prefixes); got != c.want {
			t.Errorf("VersionIn(%q, %v) = %v, want %v", c.version, c.prefixes, got, c.want)
		}
	}
	for _, c := range []struct {
		v, min string
		want   bool
	}{{"0.5.22", "0.5.22", true}, {"0.5.22.post2", "0.5.22", true}, {"0.5.21", "0.5.22", false}, {"0.6", "0.5.22", true}} {
		if got := VersionAtLeast(c.v, c.min); got != c.want {
			t.Errorf("VersionAtLeast(%q, %q) = %v", c.v, c.min, got)
		}
	}
}

func TestVenv_PthDirs(t *testing.T) {
	root := t.TempDir()
	sp := filepath.Join(root, "lib", "python3.12", "site-packages")
	if _, err := MakeVenv(root, "", map[string]string{"nvidia-cutlass-dsl": "4.2.0"}, map[string]string{
		"nvidia_cutlass_dsl.pth":                   "# the hook\nimport os; os.environ\nnvidia_cutlass_dsl/python_packages\n../../../../outside\n",
		"nvidia_cutlass_dsl/python_packages/.keep": "",
		"other.pth":       "other_dir\n",
		"other_dir/.keep": "",
		"nvidia_cutlass_dsl-4.2.0.dist-info/RECORD":   "x\n",
		"nvidia_cutlass_dsl-4.2.0.dist-info/METADATA": "Name: nvidia-cutlass-dsl\nVersion: 4.2.0\n\n",
	}); err != nil {
		t.Fatal(err)
	}
	v, err := FindVenv(root)
	if err != nil {
		t.Fatal(err)
	}
	got := v.PthDirs("nvidia_cutlass_dsl")
	want := filepath.Join(sp, "nvidia_cutlass_dsl", "python_packages")
	if len(got) != 1 || got[0] != want {
		t.Fatalf("PthDirs = %v, want [%s]", got, want)
	}
	if d, ok := v.Dist("NVIDIA_Cutlass.DSL"); !ok || d.Version != "4.2.0" {
		t.Fatalf("Dist by a differently spelled name: %v %v", d, ok)
	}
}

func TestDecodeFamily(t *testing.T) {
	keys := []Key{{Name: "n", Type: "int", Min: 1}, {Name: "s", Type: "string", Values: []string{"a", "b"}}, {Name: "b", Type: "bool"}}
	cases := []struct {
		raw   string
		codes []string
	}{
		{raw: ``},
		{raw: `{"n":2,"s":"a","b":true}`},
		{raw: `{"n":0}`, codes: []string{"invalid_config"}},
		{raw: `{"n":1.5}`, codes: []string{"invalid_config"}},
		{raw: `{"s":"c"}`, codes: []string{"invalid_config"}},
		{raw: `{"b":"yes"}`, codes: []string{"invalid_config"}},
		{raw: `{"zz":1,"aa":2}`, codes: []string{"unknown_config_key:engine_config.fam.aa", "unknown_config_key:engine_config.fam.zz"}},
		{raw: `[1]`, codes: []string{"invalid_config"}},
	}
	for _, c := range cases {
		var r enginekit.Refusals
		cfg := DecodeFamily([]byte(c.raw), "fam", keys, &r)
		var got []string
		for _, x := range r {
			got = append(got, x.Code)
		}
		if strings.Join(got, ",") != strings.Join(c.codes, ",") {
			t.Errorf("DecodeFamily(%s) = %v, want %v", c.raw, got, c.codes)
		}
		if len(c.codes) == 0 && c.raw != "" {
			if n, ok := cfg.Int("n"); !ok || n != 2 || cfg.String("s") != "a" {
				t.Errorf("decoded %v", cfg)
			}
		}
	}
}

func TestChooseParsers(t *testing.T) {
	dir := t.TempDir()
	model := func(name, modelType, template string) string {
		d := filepath.Join(dir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "config.json"), []byte(`{"model_type":"`+modelType+`","num_hidden_layers":2}`), 0o644)
		if template != "" {
			os.WriteFile(filepath.Join(d, "chat_template.jinja"), []byte(template), 0o644)
		}
		return d
	}
	qwen3 := model("qwen3", "qwen3", "<think>{{ tools }}")
	moe := model("moe", "qwen3_moe", "")
	q35 := model("q35", "qwen3_5_moe", "<think>")
	coder := model("coder", "qwen3", "<tool_call><function=x>")
	llama := model("llama", "llama", "")
	names := ParserNames{Qwen3Tool: "hermes", CoderTool: "qwen3_coder", Reasoning: "qwen3"}
	tbl := &flags.Table{Family: "t"}
	args := func(a ...string) []flags.Arg { p, _ := tbl.SplitArgs(a); return p }
	cases := []struct {
		name              string
		in                ParserInput
		render, effective [2]string
		provenance        string
	}{
		{name: "qwen3 by family", in: ParserInput{ModelDir: qwen3}, render: [2]string{"hermes", "qwen3"}, effective: [2]string{"hermes", "qwen3"}, provenance: ProvenanceModelFamily},
		{name: "qwen3 moe without a template", in: ParserInput{ModelDir: moe}, render: [2]string{"hermes", "qwen3"}, effective: [2]string{"hermes", "qwen3"}, provenance: ProvenanceModelFamily},
		{name: "qwen3.5", in: ParserInput{ModelDir: q35}, render: [2]string{"qwen3_coder", "qwen3"}, effective: [2]string{"qwen3_coder", "qwen3"}, provenance: ProvenanceModelFamily},
		{name: "function template, no think", in: ParserInput{ModelDir: coder}, render: [2]string{"qwen3_coder", ""}, effective: [2]string{"qwen3_coder", ""}, provenance: ProvenanceModelFamily},
		{name: "unknown family", in: ParserInput{ModelDir: llama}, provenance: ProvenanceUnknownFamily},
		{name: "no model", in: ParserInput{}, provenance: ProvenanceUnknownFamily},
		{name: "declared", in: ParserInput{ModelDir: llama, Tool: "llama3_json", Reasoning: "none"}, render: [2]string{"llama3_json", ""}, effective: [2]string{"llama3_json", ""}, provenance: ProvenanceDeclared},
		{name: "off", in: ParserInput{ModelDir: qwen3, Tool: "none", Reasoning: "none"}, provenance: ProvenanceOff},
		{name: "extra args win", in: ParserInput{ModelDir: qwen3, Args: args("--tool-call-parser", "pythonic")},
			render: [2]string{"", "qwen3"}, effective: [2]string{"pythonic", "qwen3"}, provenance: ProvenanceExtraArgs},
		{name: "decisions", in: ParserInput{ModelDir: qwen3, API: "decisions"}, provenance: ProvenanceUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.ToolOption, c.in.ReasoningOption = "--tool-call-parser", "--reasoning-parser"
			got := ChooseParsers(c.in, names)
			if got.Tool != c.render[0] || got.Reasoning != c.render[1] ||
				got.Report.ToolCall != c.effective[0] || got.Report.Reasoning != c.effective[1] || got.Report.Provenance != c.provenance {
				t.Fatalf("ChooseParsers = render %q/%q report %v", got.Tool, got.Reasoning, got.Report)
			}
		})
	}
}

func TestFraction(t *testing.T) {
	for _, c := range []struct {
		part, total int64
		want        string
	}{{20, 80, "0.25"}, {10, 24, "0.4166"}, {14, 24, "0.5833"}, {99, 100, "0.98"}, {0, 80, ""}, {5, 0, ""}, {1, 1 << 40, "0.0001"}} {
		if got := Fraction(c.part, c.total); got != c.want {
			t.Errorf("Fraction(%d, %d) = %q, want %q", c.part, c.total, got, c.want)
		}
	}
	// What vLLM then asks the card for, ceil(total × fraction), is never
	// more than the grant (request_memory in vllm/v1/worker/utils.py).
	for _, c := range []struct{ part, total int64 }{{10 << 30, 24 << 30}, {14 << 30, 24 << 30}, {(7 << 30) + 12345, 24 << 30}, {23 << 30, 80 << 30}} {
		f, _ := strconv.ParseFloat(Fraction(c.part, c.total), 64)
		if asked := int64(math.Ceil(float64(c.total) * f)); asked > c.part {
			t.Errorf("Fraction(%d, %d) = %v asks vLLM for %d bytes, more than the %d granted", c.part, c.total, f, asked, c.part)
		}
	}
}

func TestBaseEnv(t *testing.T) {
	env := BaseEnv(EnvOptions{Venv: "/v", Host: &sdk.HostPolicy{EngineTelemetry: "allow", HostEnv: map[string]string{"X": "1", "DO_NOT_TRACK": "0"}},
		Launch: &sdk.LaunchContext{LaunchDir: "/l", DeviceUUIDs: []string{"GPU-a", "GPU-b"}}})
	want := map[string]string{"PATH": "/v/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/l", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "X": "1", "DO_NOT_TRACK": "0"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	// Telemetry off wins over the host's own variables.
	env = BaseEnv(EnvOptions{Venv: "/v", Host: &sdk.HostPolicy{HostEnv: map[string]string{"DO_NOT_TRACK": "0"}}, Launch: &sdk.LaunchContext{}})
	if env["DO_NOT_TRACK"] != "1" {
		t.Fatalf("DO_NOT_TRACK=%q with telemetry off", env["DO_NOT_TRACK"])
	}
}

// TestLMCacheHashSeed: every launch of an instance that reaches the same
// LMCache server gets the same PYTHONHASHSEED (so a restarted engine
// finds the chunks its previous process stored), another instance or
// another server another one, and Python accepts it (an integer in
// [0, 4294967295]).
func TestLMCacheHashSeed(t *testing.T) {
	seed := LMCacheHashSeed("chat/0", 41299)
	if again := LMCacheHashSeed("chat/0", 41299); again != seed {
		t.Fatalf("the same instance and server: %s then %s", seed, again)
	}
	for _, other := range []string{LMCacheHashSeed("chat/1", 41299), LMCacheHashSeed("chat/0", 41300)} {
		if other == seed {
			t.Fatalf("another instance or server shares the seed %s", seed)
		}
	}
	if n, err := strconv.ParseUint(seed, 10, 32); err != nil {
		t.Fatalf("seed %q (%d) is no PYTHONHASHSEED: %v", seed, n, err)
	}
}
