// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestParseFile_Golden(t *testing.T) {
	cases := []struct {
		name string
		file string
	}{
		{name: "minimal", file: "minimal.hcl"},
		{name: "every knob", file: "full.hcl"},
		{name: "several deployments", file: "multi.hcl"},
		{name: "JSON syntax", file: "minimal.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join("testdata", c.file)
			ds, err := ParseFile(path)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			got, err := json.MarshalIndent(ds, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := path + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./core/jobspec -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("completed spec differs from %s (go test ./core/jobspec -update to accept):\n%s", golden, got)
			}
			for _, d := range ds {
				if err := Validate(d); err != nil {
					t.Errorf("Validate of a parsed deployment: %v", err)
				}
			}
		})
	}
}

func TestParse_Defaults(t *testing.T) {
	ds, err := Parse([]byte(`deployment "a" {
  engine = "vllm"
  model { path = "m" }
  limits { max_waiting = 0 }
}`), "a.hcl")
	if err != nil {
		t.Fatal(err)
	}
	d := ds[0]
	cases := []struct {
		name      string
		got, want any
		field     string
		from      string
	}{
		{name: "api", got: d.API, want: "chat", field: "api", from: FromDefault},
		{name: "routes", got: strings.Join(d.Routes, ","), want: "a", field: "routes", from: FromDefault},
		{name: "instances", got: d.Instances, want: 1, field: "instances", from: FromDefault},
		{name: "activation", got: d.Lifecycle.Activation, want: "on_demand", field: "lifecycle.activation", from: FromDefault},
		{name: "request deadline", got: d.RequestDeadline.String(), want: "10m", field: "request_deadline", from: FromDefault},
		{name: "stream idle", got: d.Limits.StreamIdle.String(), want: "2m", field: "limits.stream_idle", from: FromDefault},
		{name: "client read idle", got: d.Limits.ClientReadIdle.String(), want: "10s", field: "limits.client_read_idle", from: FromDefault},
		{name: "max chunk", got: d.Limits.MaxChunkBytes.String(), want: "64KiB", field: "limits.max_chunk_bytes", from: FromDefault},
		{name: "explicit zero max waiting stays", got: d.Limits.MaxWaiting, want: 0, field: "limits.max_waiting", from: FromFile},
		{name: "fingerprint", got: d.Model.ContentFingerprint, want: "measured", field: "model.content_fingerprint", from: FromDefault},
		{name: "residency left to the engine", got: d.Residency, want: "", field: "residency", from: FromDefault},
		{name: "engine", got: d.Engine, want: "vllm", field: "engine", from: FromFile},
		{name: "model path", got: d.Model.Path, want: "m", field: "model.path", from: FromFile},
		{name: "name", got: d.Name, want: "a", field: "name", from: FromFile},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Errorf("value = %v, want %v", c.got, c.want)
			}
			if got := d.Provenance[c.field]; got != c.from {
				t.Errorf("provenance[%s] = %q, want %q", c.field, got, c.from)
			}
		})
	}
	if d.Source != "a.hcl:1" {
		t.Errorf("source = %q, want a.hcl:1", d.Source)
	}
	if _, ok := d.Provenance["resources"]; !ok {
		t.Error("provenance lacks resources")
	}
}

func TestParse_HFShorthand(t *testing.T) {
	ds, err := Parse([]byte(`deployment "a" {
  engine = "vllm"
  model { hf = "Org/Name@0123456789abcdef0123456789abcdef01234567" }
}`), "a.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if m := ds[0].Model; m.HF != "Org/Name" || m.Revision != "0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("model = %+v", m)
	}
}

// wantInvalid checks the error is invalid_config (exit 2) and its message
// starts with the position and holds the words.
func wantInvalid(t *testing.T, err error, prefix, contains string) {
	t.Helper()
	if err == nil {
		t.Fatal("want an error")
	}
	e := structs.AsError(err)
	if e.Code != structs.CodeInvalidConfig {
		t.Fatalf("code = %q, want invalid_config (%v)", e.Code, err)
	}
	if e.Info().Exit != 2 {
		t.Errorf("exit = %d, want 2", e.Info().Exit)
	}
	if !strings.HasPrefix(e.Message, prefix) {
		t.Errorf("message %q does not start with %q", e.Message, prefix)
	}
	if !strings.Contains(e.Message, contains) {
		t.Errorf("message %q does not contain %q", e.Message, contains)
	}
	diags, ok := e.Details["diagnostics"].([]Diagnostic)
	if !ok || len(diags) == 0 {
		t.Errorf("details lack diagnostics: %#v", e.Details)
	}
}

func TestParse_Invalid(t *testing.T) {
	const head = "deployment \"a\" {\n  engine = \"vllm\"\n  model { path = \"m\" }\n"
	cases := []struct {
		name     string
		src      string
		prefix   string
		contains string
	}{
		{name: "syntax error", src: "deployment \"a\" {\n  engine = \n}", prefix: "bad.hcl:2:", contains: ""},
		{name: "no deployment", src: "# nothing\n", prefix: "bad.hcl:", contains: "no deployment"},
		{name: "unknown top-level attribute", src: "name = \"x\"\n", prefix: "bad.hcl:1:1: ", contains: "Unsupported argument"},
		{name: "unknown attribute", src: head + "  colour = \"red\"\n}", prefix: "bad.hcl:4:3: ", contains: "colour"},
		{name: "unknown block", src: head + "  scheduling { hosts = [] }\n}", prefix: "bad.hcl:4:3: ", contains: "scheduling"},
		{name: "placement without hosts", src: head + "  placement { hosts = [] }\n}", prefix: "bad.hcl:4:", contains: "names no host"},
		{name: "placement with a bad host name", src: head + "  placement { hosts = [\"GPU_A\"] }\n}", prefix: "bad.hcl:4:", contains: "not a host name"},
		{name: "placement with a host twice", src: head + "  placement { hosts = [\"gpu-a\", \"gpu-a\"] }\n}", prefix: "bad.hcl:4:", contains: "listed twice"},
		{name: "unknown attribute in a nested block", src: head + "  lifecycle { warmth = true }\n}", prefix: "bad.hcl:4:15: ", contains: "warmth"},
		{name: "bad name", src: "deployment \"Chat Small\" {\n  engine = \"vllm\"\n  model { path = \"m\" }\n}", prefix: "bad.hcl:1:12: ", contains: "invalid name"},
		{name: "missing engine", src: "deployment \"a\" {\n  model { path = \"m\" }\n}", prefix: "bad.hcl:1:1: ", contains: "engine is required"},
		{name: "bad api", src: head + "  api = \"completions\"\n}", prefix: "bad.hcl:4:9: ", contains: "invalid api"},
		{name: "bad residency", src: head + "  residency = \"shallow\"\n}", prefix: "bad.hcl:4:15: ", contains: "invalid residency"},
		{name: "bad lmcache", src: head + "  lmcache = \"always\"\n}", prefix: "bad.hcl:4:13: ", contains: "invalid lmcache"},
		{name: "small lmcache_pool", src: head + "  lmcache_pool = \"512MiB\"\n}", prefix: "bad.hcl:4:18: ", contains: "lmcache_pool"},
		{name: "instances zero", src: head + "  instances = 0\n}", prefix: "bad.hcl:4:15: ", contains: "0 is outside 1..64"},
		{name: "instances too many", src: head + "  instances = 65\n}", prefix: "bad.hcl:4:15: ", contains: "outside 1..64"},
		{name: "instances fractional", src: head + "  instances = 1.5\n}", prefix: "bad.hcl:4:15: ", contains: "whole number"},
		{name: "instances not a number", src: head + "  instances = \"two\"\n}", prefix: "bad.hcl:4:15: ", contains: "whole number"},
		{name: "bad duration", src: head + "  request_deadline = \"10 minutes\"\n}", prefix: "bad.hcl:4:22: ", contains: "does not parse"},
		{name: "negative duration", src: head + "  request_deadline = \"-5s\"\n}", prefix: "bad.hcl:4:22: ", contains: "negative"},
		{name: "zero request deadline", src: head + "  request_deadline = \"0s\"\n}", prefix: "bad.hcl:4:22: ", contains: "longer than 0s"},
		{name: "zero timeout", src: head + "  timeouts { wake = \"0s\" }\n}", prefix: "bad.hcl:4:21: ", contains: "leave it out"},
		{name: "empty routes", src: head + "  routes = []\n}", prefix: "bad.hcl:4:12: ", contains: "at least one route"},
		{name: "route listed twice", src: head + "  routes = [\"a\", \"a\"]\n}", prefix: "bad.hcl:4:12: ", contains: "listed twice"},
		{name: "route syntax", src: head + "  routes = [\"has space\"]\n}", prefix: "bad.hcl:4:12: ", contains: "route \"has space\""},
		{name: "routes null element", src: head + "  routes = [\"a\", null]\n}", prefix: "bad.hcl:4:12: ", contains: "null"},
		{name: "duplicate block", src: head + "  model { path = \"n\" }\n}", prefix: "bad.hcl:4:3: ", contains: "duplicate model block"},
		{name: "path and hf", src: "deployment \"a\" {\n  engine = \"vllm\"\n  model {\n    path = \"m\"\n    hf = \"o/n\"\n  }\n}", prefix: "bad.hcl:5:10: ", contains: "exclude each other"},
		{name: "no model", src: "deployment \"a\" {\n  engine = \"vllm\"\n}", prefix: "bad.hcl:1:1: ", contains: "a model needs"},
		{name: "path escapes the models root", src: "deployment \"a\" {\n  engine = \"vllm\"\n  model { path = \"../etc\" }\n}", prefix: "bad.hcl:3:18: ", contains: "leaves the models root"},
		{name: "bad hf", src: "deployment \"a\" {\n  engine = \"vllm\"\n  model { hf = \"just-a-name\" }\n}", prefix: "bad.hcl:3:16: ", contains: "Hugging Face"},
		{name: "short hf revision", src: "deployment \"a\" {\n  engine = \"vllm\"\n  model {\n    hf = \"o/n\"\n    revision = \"abc\"\n  }\n}", prefix: "bad.hcl:5:16: ", contains: "40-hex"},
		{name: "bad fingerprint", src: "deployment \"a\" {\n  engine = \"vllm\"\n  model {\n    path = \"m\"\n    content_fingerprint = \"md5:00\"\n  }\n}", prefix: "bad.hcl:5:27: ", contains: "sha256"},
		{name: "bad size", src: head + "  resources {\n    gpu = \"11 gigs\"\n  }\n}", prefix: "bad.hcl:5:11: ", contains: "unknown unit"},
		{name: "empty resources", src: head + "  resources {}\n}", prefix: "bad.hcl:4:3: ", contains: "declares nothing"},
		{name: "both resources forms", src: head + "  resources {\n    gpu = \"1GiB\"\n    ready { gpu = \"1GiB\" }\n  }\n}", prefix: "bad.hcl:4:3: ", contains: "not both"},
		{name: "unknown phase", src: head + "  resources {\n    cold { gpu = \"1GiB\" }\n  }\n}", prefix: "bad.hcl:5:5: ", contains: "cold"},
		{name: "startup below ready", src: head + "  resources {\n    startup { gpu = \"10GiB\" }\n    ready { gpu = \"11GiB\" }\n  }\n}", prefix: "bad.hcl:5:21: ", contains: "smaller than ready"},
		{name: "parked above ready", src: head + "  resources {\n    ready { gpu = \"10GiB\" }\n    parked { gpu = \"11GiB\" }\n  }\n}", prefix: "bad.hcl:6:20: ", contains: "frees card memory"},
		{name: "bad activation", src: head + "  lifecycle { activation = \"always\" }\n}", prefix: "bad.hcl:4:28: ", contains: "invalid lifecycle.activation"},
		{name: "warm with idle timeout", src: head + "  lifecycle {\n    warm = true\n    ready_idle_timeout = \"5m\"\n  }\n}", prefix: "bad.hcl:6:26: ", contains: "warm deployment"},
		{name: "max concurrent requests zero", src: head + "  engine_config { max_concurrent_requests = 0 }\n}", prefix: "bad.hcl:4:45: ", contains: "outside 1..1024"},
		{name: "max concurrent requests too many", src: head + "  engine_config { max_concurrent_requests = 2000 }\n}", prefix: "bad.hcl:4:45: ", contains: "outside 1..1024"},
		{name: "bad dtype", src: head + "  engine_config { dtype = \"int3\" }\n}", prefix: "bad.hcl:4:27: ", contains: "invalid engine_config.dtype"},
		{name: "memory startup below request", src: head + "  engine_config {\n    memory {\n      request = \"20GiB\"\n      startup = \"10GiB\"\n    }\n  }\n}", prefix: "bad.hcl:7:17: ", contains: "smaller than request"},
		{name: "memory startup with resources", src: head + "  resources {\n    gpu = \"1GiB\"\n  }\n  engine_config {\n    memory { startup = \"10GiB\" }\n  }\n}", prefix: "bad.hcl:8:24: ", contains: "resources block declares"},
		{name: "extra args without accept", src: head + "  engine_config { extra_args = [\"--x\"] }\n}", prefix: "bad.hcl:4:32: ", contains: "accept_extra_args"},
		{name: "short option", src: head + "  engine_config {\n    accept_extra_args = true\n    extra_args = [\"--a\", \"-tp\", \"2\"]\n  }\n}", prefix: "bad.hcl:6:18: ", contains: "short option"},
		{name: "bad env name", src: head + "  engine_config { env = { \"1BAD\" = \"x\" } }\n}", prefix: "bad.hcl:4:25: ", contains: "not a variable name"},
		{name: "family block of another engine", src: head + "  engine_config {\n    sglang { x = 1 }\n  }\n}", prefix: "bad.hcl:5:5: ", contains: "takes no sglang block"},
		{name: "nested block in a family block", src: head + "  engine_config {\n    vllm {\n      nested { x = 1 }\n    }\n  }\n}", prefix: "bad.hcl:6:7: ", contains: "Blocks are not allowed"},
		{name: "unknown family", src: head + "  engine_config {\n    ollama { x = 1 }\n  }\n}", prefix: "bad.hcl:5:5: ", contains: "ollama"},
		{name: "variables refused", src: head + "  api = var.api\n}", prefix: "bad.hcl:4:9: ", contains: "Variables not allowed"},
		{name: "duplicate deployment", src: head + "}\n" + head + "}\n", prefix: "bad.hcl:5:12: ", contains: "already declared at bad.hcl:1"},
		{name: "route conflict", src: head + "}\ndeployment \"b\" {\n  engine = \"vllm\"\n  model { path = \"m\" }\n  routes = [\"b\", \"a\"]\n}\n", prefix: "bad.hcl:8:12: ", contains: "already served by deployment \"a\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.src), "bad.hcl")
			wantInvalid(t, err, c.prefix, c.contains)
		})
	}
}

func TestParse_AllDiagnostics(t *testing.T) {
	src := "deployment \"a\" {\n  engine = \"vllm\"\n  model { path = \"m\" }\n  api = \"x\"\n  instances = 0\n}\n"
	_, err := Parse([]byte(src), "bad.hcl")
	e := structs.AsError(err)
	diags, _ := e.Details["diagnostics"].([]Diagnostic)
	if len(diags) != 2 {
		t.Fatalf("diagnostics = %+v, want 2", diags)
	}
	if diags[0].Line != 4 || diags[1].Line != 5 || diags[0].File != "bad.hcl" || diags[0].Field != "api" {
		t.Errorf("diagnostics = %+v", diags)
	}
	if !strings.Contains(e.Message, "(and 1 more)") {
		t.Errorf("message %q does not count the rest", e.Message)
	}
	if e.Details["field"] != "api" {
		t.Errorf("details.field = %v", e.Details["field"])
	}
}

func TestParse_JSONSyntaxInvalid(t *testing.T) {
	src := "{\n  \"deployment\": {\n    \"a\": {\n      \"engine\": \"vllm\",\n      \"model\": {\"path\": \"m\"},\n      \"instances\": 100\n    }\n  }\n}\n"
	_, err := Parse([]byte(src), "bad.json")
	wantInvalid(t, err, "bad.json:6:20: ", "outside 1..64")
	_, err = Parse([]byte(`{"deployment": {"a": {"engine": "vllm", "colour": 1}}}`), "bad.json")
	wantInvalid(t, err, "bad.json:1:", "colour")
}

func TestParseFile_Missing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.hcl")
	_, err := ParseFile(path)
	wantInvalid(t, err, path+": ", "cannot read the job spec")
}

// TestParseFile_Bounds: a deeply nested list and an oversized file are
// refused with their position and exit 2, without crashing this process
// (100,000 "[" took hclsyntax past Go's stack limit, a fatal error).
func TestParseFile_Bounds(t *testing.T) {
	const head = "deployment \"a\" {\n  engine = \"vllm\"\n  model { path = \"m\" }\n"
	cases := []struct {
		name, file, src, prefix, contains string
	}{
		{"nested list", "deep.hcl", head + "  routes = " + strings.Repeat("[", 100000) + "\n}\n", "deep.hcl:4:", "nested too deeply"},
		{"nested unary operators", "deep.hcl", head + "  instances = " + strings.Repeat("-", 100000) + "1\n}\n", "deep.hcl:4:", "nested too deeply"},
		{"nested json", "deep.json", `{"deployment": {"a": {"routes": ` + strings.Repeat("[", 100000) + "}}}", "deep.json:1:", "nested too deeply"},
		{"oversize", "big.hcl", head + "}\n" + strings.Repeat("# padding padding padding\n", 50000), "big.hcl:", "too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), c.file)
			if err := os.WriteFile(path, []byte(c.src), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ParseFile(path)
			wantInvalid(t, err, path[:len(path)-len(c.file)]+c.prefix, c.contains)
		})
	}
}

// TestParse_API: api takes chat, decisions, embeddings and rerank; anything else
// is refused at the field.
func TestParse_API(t *testing.T) {
	cases := []struct {
		name, api string
		ok        bool
	}{
		{name: "chat", api: "chat", ok: true},
		{name: "decisions", api: "decisions", ok: true},
		{name: "embeddings", api: "embeddings", ok: true},
		{name: "rerank", api: "rerank", ok: true},
		{name: "score is not an api", api: "score"},
		{name: "completions is not an api", api: "completions"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := "deployment \"a\" {\n  engine = \"vllm\"\n  model { path = \"m\" }\n  api = \"" + c.api + "\"\n}\n"
			ds, err := Parse([]byte(src), "a.hcl")
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				if ds[0].API != c.api || ds[0].Provenance["api"] != FromFile {
					t.Fatalf("api %q from %q", ds[0].API, ds[0].Provenance["api"])
				}
				return
			}
			if e := structs.AsError(err); e == nil || e.Details["field"] != "api" {
				t.Fatalf("want a refusal at api, got %v", err)
			}
		})
	}
}
