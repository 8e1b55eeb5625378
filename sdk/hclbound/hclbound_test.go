// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hclbound

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
)

const realSpec = `# a job spec
deployment "chat-small" {
  engine = "vllm"
  model { path = "qwen3-4b" }
  engine_config {
    args = ["--max-model-len", "8192", "--served-model-name=[x]"]
    env  = { HF_TOKEN = "secret", PATTERN = "[[[[[[[[[[" }
  }
  description = <<-EOT
    [[[[[[[[[[[[ {{{{{{{{ ${ "a" } ]]]]
    EOT
  idle = var.a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u-v-w-x-y-z-a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u-v-w-x-y-z-a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u-v-w-x-y-z-a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u-v-w-x-y-z
  /* [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ */
  // ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((
  n = 1 + 2 - 3 * 4 / 5 % 6
  m = a == b && c <= d || !x ? -y : z
}
`

// TestLimits_Check: the depth is counted as the parser would descend, and
// text the parser does not descend into (comments, strings, heredoc text,
// identifiers with dashes) counts for nothing.
func TestLimits_Check(t *testing.T) {
	lim := Limits{Bytes: 1 << 20, Depth: 10}
	deep := func(open string, n int) string { return strings.Repeat(open, n) }
	cases := []struct {
		name, file, src   string
		wantLine, wantCol int // 0: accepted
	}{
		{"real spec", "a.hcl", realSpec, 0, 0},
		{"ten lists", "a.hcl", "a = " + deep("[", 10) + deep("]", 10) + "\n", 0, 0},
		{"eleven lists", "a.hcl", "a = " + deep("[", 11) + deep("]", 11) + "\n", 1, 15},
		{"blocks", "a.hcl", "a {\n" + deep("b {\n", 10) + "}\n", 11, 3},
		{"sequential lists", "a.hcl", strings.Repeat("a = [[[[[[]]]]]]\n", 50), 0, 0},
		{"unary operators", "a.hcl", "a = " + deep("!", 11) + "true\n", 1, 15},
		{"binary chain", "a.hcl", "a = 1" + deep("+1", 11) + "\n", 1, 26},
		{"binary chain over lines", "a.hcl", "a = (1" + deep(" +\n1", 10) + ")\n", 10, 3},
		{"binary chains in a list", "a.hcl", "a = [" + strings.Repeat("1+1+1, ", 50) + "]\n", 0, 0},
		{"object items on lines", "a.hcl", "a = {\n" + strings.Repeat("x = 1 + 1\n", 50) + "}\n", 0, 0},
		{"interpolations", "a.hcl", "a = " + deep(`"${`, 6) + "\n", 1, 20},
		{"escaped interpolations", "a.hcl", `a = "` + deep("$${", 50) + `"` + "\n", 0, 0},
		{"heredoc interpolation", "a.hcl", "a = <<EOT\n" + deep("${(", 6) + "\nEOT\n", 2, 15},
		{"string ends at newline", "a.hcl", "a = \"x\nb = " + deep("[", 11) + "\n", 2, 15},
		{"json arrays", "a.json", `{"a":` + deep("[", 10) + "\n", 1, 15},
		{"json template", "a.json", `{"a": "${` + deep(`[`, 9) + `}"}`, 1, 7},
		{"json escaped template", "a.json", `{"a": "\u0024{` + deep(`[`, 9) + `}"}`, 1, 7},
		{"json brackets in a string", "a.json", `{"a": "` + deep(`[`, 50) + `"}`, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			diags := lim.Check([]byte(c.src), c.file)
			if c.wantLine == 0 {
				if diags.HasErrors() {
					t.Fatalf("refused: %v", diags)
				}
				return
			}
			if !diags.HasErrors() {
				t.Fatal("accepted")
			}
			d := diags[0]
			if d.Summary != "Configuration nested too deeply" || d.Subject == nil || d.Subject.Filename != c.file {
				t.Fatalf("diagnostic %+v", d)
			}
			if got := d.Subject.Start; got.Line != c.wantLine || got.Column != c.wantCol {
				t.Fatalf("at %d:%d, want %d:%d (%s)", got.Line, got.Column, c.wantLine, c.wantCol, d.Detail)
			}
		})
	}
}

// TestCheck_Size: a file over the bound is refused at the first byte past
// it, whatever it holds.
func TestCheck_Size(t *testing.T) {
	src := []byte(strings.Repeat("a = 1\n", MaxBytes/6+1))
	diags := Check(src, "big.hcl")
	if !diags.HasErrors() || diags[0].Summary != "Configuration too large" {
		t.Fatalf("diags %v", diags)
	}
	if p := diags[0].Subject.Start; p.Line != MaxBytes/6+1 || p.Column != MaxBytes%6+1 || p.Byte != MaxBytes {
		t.Fatalf("at %+v", p)
	}
	if diags := Check(src[:MaxBytes], "big.hcl"); diags.HasErrors() {
		t.Fatalf("a file at the bound is refused: %v", diags)
	}
}

// TestCheck_HostileParsesSafely builds the inputs that took the parser
// past Go's stack limit (a fatal error: this test process would die) and
// checks each is refused; the same inputs within the bounds parse and
// evaluate here, in the test process.
func TestCheck_HostileParsesSafely(t *testing.T) {
	n := 100000
	hostile := []struct{ name, file, src string }{
		{"nested lists", "a.hcl", "a = " + strings.Repeat("[", n) + "\n"},
		{"nested objects", "a.hcl", "a = " + strings.Repeat("{a = ", n) + "\n"},
		{"nested blocks", "a.hcl", strings.Repeat("a {\n", n)},
		{"unary operators", "a.hcl", "a = " + strings.Repeat("!", n) + "true\n"},
		{"binary chain", "a.hcl", "a = 1" + strings.Repeat("+1", n) + "\n"},
		{"nested interpolations", "a.hcl", "a = " + strings.Repeat(`"${`, n) + "\n"},
		{"json arrays", "a.json", `{"a":` + strings.Repeat("[", n)},
		{"json template", "a.json", `{"a":"${` + strings.Repeat("[", n) + `"}`},
	}
	for _, c := range hostile {
		t.Run(c.name, func(t *testing.T) {
			if diags := Check([]byte(c.src), c.file); !diags.HasErrors() {
				t.Fatalf("accepted %d bytes", len(c.src))
			}
		})
	}
	// At the bound, every shape parses and evaluates.
	ok := []struct{ name, file, src string }{
		{"lists", "a.hcl", "a = " + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + "\n"},
		{"unary", "a.hcl", "a = " + strings.Repeat("!", MaxDepth) + "true\n"},
		{"binary", "a.hcl", "a = 1" + strings.Repeat("+1", MaxDepth) + "\n"},
		{"json", "a.json", `{"a":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + "}"},
	}
	for _, c := range ok {
		t.Run("at the bound/"+c.name, func(t *testing.T) {
			if diags := Check([]byte(c.src), c.file); diags.HasErrors() {
				t.Fatalf("refused: %v", diags)
			}
			var f *hcl.File
			var diags hcl.Diagnostics
			if strings.HasSuffix(c.file, ".json") {
				f, diags = hcljson.Parse([]byte(c.src), c.file)
			} else {
				f, diags = hclsyntax.ParseConfig([]byte(c.src), c.file, hcl.InitialPos)
			}
			if diags.HasErrors() {
				t.Fatalf("parse: %v", diags)
			}
			attrs, diags := f.Body.JustAttributes()
			if diags.HasErrors() {
				t.Fatalf("attributes: %v", diags)
			}
			if _, diags := attrs["a"].Expr.Value(nil); diags.HasErrors() {
				t.Fatalf("value: %v", diags)
			}
		})
	}
}

// FuzzCheck: the scan never panics, and what it accepts under a small
// bound parses without descending past it.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(realSpec))
	f.Add([]byte("a = <<-EOT\n${[1]}\n  EOT\n"))
	f.Add([]byte(`a = "${"${x}"}" # [`))
	f.Fuzz(func(t *testing.T, src []byte) {
		Check(src, "f.hcl")
		Check(src, "f.json")
	})
}
