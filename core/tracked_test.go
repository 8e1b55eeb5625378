// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package core_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// headBytes is how much of each tracked file the guard reads: enough for
// every magic number below, the PE header offset included.
const headBytes = 4096

// untrackable says why a tracked file may not be committed, or "" when it
// may. The rule (make check runs it):
//   - no compiled program, whatever its mode: ELF, Mach-O (thin or fat) or
//     Windows PE. Binaries come from `make build` into ./bin, never from git;
//   - the executable bit only on a script that names its interpreter on a
//     "#!/..." first line (.ci/run, scripts/*.sh). Data and sources are
//     0644, so a stray chmod +x is caught too.
//
// Symbolic links and submodules (modes 120000 and 160000) are not files
// and pass.
func untrackable(mode string, head []byte) string {
	if mode != "100644" && mode != "100755" {
		return ""
	}
	if kind := binaryKind(head); kind != "" {
		return kind + " binary: build it with make build into ./bin instead of committing it"
	}
	if mode == "100755" && !bytes.HasPrefix(head, []byte("#!/")) {
		return "executable bit on a file that is not a script with a #!/ interpreter line: git update-index --chmod=-x"
	}
	return ""
}

// binaryKind names the executable format head starts with, or "".
func binaryKind(head []byte) string {
	if len(head) < 4 {
		return ""
	}
	switch {
	case bytes.HasPrefix(head, []byte{0x7f, 'E', 'L', 'F'}):
		return "ELF"
	case bytes.HasPrefix(head, []byte{0xfe, 0xed, 0xfa, 0xce}),
		bytes.HasPrefix(head, []byte{0xfe, 0xed, 0xfa, 0xcf}),
		bytes.HasPrefix(head, []byte{0xce, 0xfa, 0xed, 0xfe}),
		bytes.HasPrefix(head, []byte{0xcf, 0xfa, 0xed, 0xfe}),
		bytes.HasPrefix(head, []byte{0xca, 0xfe, 0xba, 0xbe}):
		// 0xcafebabe is also a Java class file: no more welcome here.
		return "Mach-O"
	case bytes.HasPrefix(head, []byte("MZ")) && len(head) >= 0x40:
		// A DOS stub alone is "MZ"; a Windows program has "PE\0\0" where
		// the stub's e_lfanew field points, so text starting "MZ" passes.
		off := int(binary.LittleEndian.Uint32(head[0x3c:0x40]))
		if off+4 <= len(head) && bytes.Equal(head[off:off+4], []byte("PE\x00\x00")) {
			return "Windows PE"
		}
	}
	return ""
}

// TestTrackedFiles_NoExecutables refuses a committed binary or a stray
// executable bit anywhere in the index (what the next commit holds).
func TestTrackedFiles_NoExecutables(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not on PATH")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not a git checkout (a source archive): nothing tracked to check")
	}
	root := strings.TrimSpace(string(top))
	out, err := exec.Command("git", "-C", root, "ls-files", "-s", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	type entry struct{ mode, blob, path string }
	var entries []entry
	for _, rec := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		// "<mode> <blob> <stage>\t<path>"
		meta, path, ok := strings.Cut(rec, "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 3 {
			t.Fatalf("git ls-files: unexpected record %q", rec)
		}
		entries = append(entries, entry{mode: f[0], blob: f[1], path: path})
	}
	if len(entries) == 0 {
		t.Fatal("git ls-files listed nothing: the guard would pass vacuously")
	}

	// One git cat-file for every blob: the index's content, not the work
	// tree's, so an added-but-deleted binary is still seen.
	cmd := exec.Command("git", "-C", root, "cat-file", "--batch")
	var in strings.Builder
	for _, e := range entries {
		fmt.Fprintln(&in, e.blob)
	}
	cmd.Stdin = strings.NewReader(in.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("git cat-file: %v", err)
	}
	r := bufio.NewReader(stdout)
	var bad []string
	for _, e := range entries {
		head, err := readBlobHead(r)
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("git cat-file %s (%s): %v", e.blob, e.path, err)
		}
		if why := untrackable(e.mode, head); why != "" {
			bad = append(bad, e.path+": "+why)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("git cat-file: %v", err)
	}
	if len(bad) > 0 {
		t.Fatalf("tracked files that must not be committed (git rm --cached them, or fix the mode):\n%s", strings.Join(bad, "\n"))
	}
}

// readBlobHead reads one "<sha> <type> <size>\n<content>\n" record of
// git cat-file --batch and returns the content's first headBytes.
func readBlobHead(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	f := strings.Fields(line)
	if len(f) != 3 {
		return nil, fmt.Errorf("unexpected header %q", strings.TrimSpace(line))
	}
	size, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("header %q: %w", strings.TrimSpace(line), err)
	}
	n := min(size, headBytes)
	head := make([]byte, n)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, r, size-n+1); err != nil { // the rest and the record's newline
		return nil, err
	}
	return head, nil
}

// TestUntrackable checks the rule on each kind of file the guard meets.
func TestUntrackable(t *testing.T) {
	elf := append([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1}, make([]byte, 64)...)
	pe := make([]byte, 0x90)
	copy(pe, "MZ")
	binary.LittleEndian.PutUint32(pe[0x3c:], 0x80)
	copy(pe[0x80:], "PE\x00\x00")
	cases := []struct {
		name string
		mode string
		head []byte
		bad  bool
	}{
		{name: "go source", mode: "100644", head: []byte("// Copyright (c) CapyCTL authors\npackage main\n")},
		{name: "empty file", mode: "100644", head: nil},
		{name: "shell script", mode: "100755", head: []byte("#!/usr/bin/env bash\nset -e\n")},
		{name: "gguf data", mode: "100644", head: []byte("GGUF\x03\x00\x00\x00")},
		{name: "bbolt data", mode: "100644", head: []byte{0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0xed, 0xda, 0x0c, 0xed}},
		{name: "text starting MZ", mode: "100644", head: []byte("MZ is a text file that happens to start like a DOS program, and is long enough to have 0x3c\n")},
		{name: "symlink", mode: "120000", head: []byte("\x7fELF")},
		{name: "ELF 0644", mode: "100644", head: elf, bad: true},
		{name: "ELF 0755", mode: "100755", head: elf, bad: true},
		{name: "Mach-O 64 little-endian", mode: "100755", head: []byte{0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0, 1}, bad: true},
		{name: "Mach-O fat", mode: "100644", head: []byte{0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 2}, bad: true},
		{name: "Windows PE", mode: "100644", head: pe, bad: true},
		{name: "executable source", mode: "100755", head: []byte("package main\n"), bad: true},
		{name: "executable data", mode: "100755", head: []byte("GGUF\x03"), bad: true},
		{name: "executable without a path after #!", mode: "100755", head: []byte("#! bash\n"), bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			why := untrackable(c.mode, c.head)
			if (why != "") != c.bad {
				t.Fatalf("untrackable(%s, %q) = %q, want refused=%v", c.mode, c.head, why, c.bad)
			}
		})
	}
}
