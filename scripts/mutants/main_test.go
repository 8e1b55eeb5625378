// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: the table counts each status; a survivor listed by file,
// column, type, its line and the next is explained, one on an equal line
// elsewhere in the file is not.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	src := "package p\n\nfunc f(a int) bool {\n\tif a > 0 {\n\t\treturn true\n\t}\n\tif a > 0 {\n\t\treturn false\n\t}\n\treturn a == 1\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	results := `{"files":[{"file_name":"p.go","mutations":[
		{"type":"CONDITIONALS_BOUNDARY","status":"LIVED","line":4,"column":7},
		{"type":"CONDITIONALS_BOUNDARY","status":"LIVED","line":7,"column":7},
		{"type":"CONDITIONALS_NEGATION","status":"KILLED","line":10,"column":11},
		{"type":"CONDITIONALS_NEGATION","status":"TIMED OUT","line":4,"column":7},
		{"type":"CONDITIONALS_NEGATION","status":"NOT COVERED","line":7,"column":7}]}]}`
	js := filepath.Join(dir, "p.json")
	if err := os.WriteFile(js, []byte(results), 0o644); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(dir, "survivors.tsv")
	row := strings.Join([]string{filepath.Join(dir, "p.go"), "7", "CONDITIONALS_BOUNDARY", "if a > 0 {", "return true", "equivalent: a test"}, "\t")
	if err := os.WriteFile(list, []byte("# comment\n"+row+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	listed, err := readList(list)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	n := run(&out, []string{dir + "=" + js}, listed)
	got := out.String()
	if n != 1 {
		t.Fatalf("%d unlisted, want 1 (the equal line 7):\n%s", n, got)
	}
	for _, want := range []string{"| 1 | 2 | 1 | 0 | 1 | 50.0% | 80.0% |", "1 mutants lived and are listed", "p.go:7:7\tCONDITIONALS_BOUNDARY\tif a > 0 {\treturn false"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if _, err := readList(writeFile(t, dir, "bad.tsv", "a\tb\n")); err == nil {
		t.Fatal("a line without a reason was read")
	}
}

func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
