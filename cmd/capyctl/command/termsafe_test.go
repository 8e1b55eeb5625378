// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
)

func TestEscapeTerminal(t *testing.T) {
	for in, want := range map[string]string{
		"gpu-a\tready\n":             "gpu-a\tready\n",
		"héllo ☃":                    "héllo ☃",
		"\x1b[2J\x1b]0;owned\x07":    `\x1b[2J\x1b]0;owned\x07`,
		"back\rover\bx\x7f":          `back\x0dover\x08x\x7f`,
		"csi\u009b31m":               `csi\u009b31m`,
		"evil\u202eexe.txt":          `evil\u202eexe.txt`,
		"raw \x9b and \xff":          `raw \x9b and \xff`,
		"isolate\u2066x\u2069\u200f": `isolate\u2066x\u2069\u200f`,
	} {
		if got := string(escapeTerminal([]byte(in))); got != want {
			t.Errorf("escapeTerminal(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCLI_HostSuppliedTextEscaped (L4): names a host supplies (its own,
// its engines', its GPUs') reach the terminal escaped, in tables and in
// error messages; --json keeps them as they are.
func TestCLI_HostSuppliedTextEscaped(t *testing.T) {
	evil := "gpu\x1b[2J\x1b]0;pwned\x07-a"
	hosts := func() []wire.Host {
		return []wire.Host{{Name: evil, Online: true, Role: "host", Engines: []string{"vllm\u202eexe"},
			GPUs: []wire.GPU{{Index: 0, Name: "H100\u009b31m", TotalBytes: 80 << 30}}}}
	}
	dir, _ := mgmtServer(t, &api.Backend{Hosts: hosts})
	out, errOut, code := runCLI(t, dir, "list", "hosts")
	if code != 0 {
		t.Fatalf("list hosts: exit %d %s", code, errOut)
	}
	for _, bad := range []string{"\x1b", "\u202e", "\u009b", "\x07"} {
		if strings.Contains(out+errOut, bad) {
			t.Fatalf("list hosts printed %q raw:\n%q", bad, out)
		}
	}
	if !strings.Contains(out, `gpu\x1b[2J\x1b]0;pwned\x07-a`) {
		t.Fatalf("list hosts does not show the name escaped:\n%s", out)
	}
	out, _, code = runCLI(t, dir, "list", "hosts", "--json")
	var list []wire.Host
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Name != evil ||
		list[0].Engines[0] != "vllm\u202eexe" || list[0].GPUs[0].Name != "H100\u009b31m" {
		t.Fatalf("list hosts --json: exit %d %s", code, out)
	}
	if strings.ContainsAny(out, "\x1b\x07\u202e\u009b") {
		t.Fatalf("list hosts --json printed a control character raw: %q", out)
	}
	// A summary and an error message carry what the server says, the
	// host's name in them included.
	for _, name := range []string{evil, evil + "-z"} {
		out, errOut, _ = runCLI(t, dir, "status", "host", name)
		if strings.Contains(out+errOut, "\x1b") || !strings.Contains(out+errOut, `\x1b[2J`) {
			t.Fatalf("status host %q: %q %q", name, out, errOut)
		}
	}
}
