// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package core_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The fleet's packages (core/fleet and the packages under it) and the
// connection takeover keep files a reader takes in at once and functions
// that fit on a screen: at most 600 lines a file and 80 a function, tests
// aside (issue #27: the fleet once had a server type of 121 methods in
// files of up to 1,213 lines and functions of up to 148).
const (
	maxFleetFileLines = 600
	maxFleetFuncLines = 80
)

func TestFleetShape(t *testing.T) {
	var bad []string
	for _, root := range []string{"fleet", "takeover"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			if n := fset.File(f.Pos()).LineCount(); n > maxFleetFileLines {
				bad = append(bad, fmtShape("core/"+path, "", n, maxFleetFileLines))
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFleetFuncLines {
					bad = append(bad, fmtShape("core/"+path, fn.Name.Name, n, maxFleetFuncLines))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("the fleet's shape:\n%s", strings.Join(bad, "\n"))
	}
}

func fmtShape(file, fn string, n, limit int) string {
	if fn != "" {
		file += ": func " + fn
	}
	return fmt.Sprintf("%s has %d lines (at most %d)", file, n, limit)
}
