// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command mutants reads gremlins' results (make mutate) and prints the
// score of each package, then every mutant that lived and is not listed in
// the survivors file with why it may live. It exits 1 when there is one.
//
//	go run ./scripts/mutants -survivors scripts/mutants/survivors.tsv core/ledger=bin/mutate/core_ledger.json ...
//
// The survivors file has one mutant a line, tab-separated: the file (from
// the module root), the column, gremlins' mutation type, the source line as
// it reads trimmed and the line after it (so a listing survives code moving
// up or down, and tells apart two equal lines), and the reason. Lines
// starting with # are comments.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// result is the part of gremlins' JSON output read here.
type result struct {
	Files []struct {
		FileName  string `json:"file_name"`
		Mutations []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Line   int    `json:"line"`
			Column int    `json:"column"`
		} `json:"mutations"`
	} `json:"files"`
}

// survivor is one mutant that lived.
type survivor struct {
	file, typ, source, next string
	line, col               int
}

func (s survivor) key() string {
	return s.file + "\t" + strconv.Itoa(s.col) + "\t" + s.typ + "\t" + s.source + "\t" + s.next
}

func main() {
	list := flag.String("survivors", "", "the file of mutants that may live, with why")
	flag.Parse()
	listed, err := readList(*list)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if n := run(os.Stdout, flag.Args(), listed); n > 0 {
		os.Exit(1)
	}
}

// run prints the table and the unlisted survivors of each pkg=json
// argument and returns how many survivors are not listed.
func run(w io.Writer, args []string, listed map[string]string) int {
	fmt.Fprintln(w, "| package | killed | lived | timed out | not viable | not covered | efficacy | mutant coverage |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	var unlisted, explained []survivor
	for _, a := range args {
		pkg, path, ok := strings.Cut(a, "=")
		if !ok {
			fmt.Fprintf(w, "| %s | (not pkg=results.json) |\n", a)
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(w, "| %s | no results: %v |\n", pkg, err)
			unlisted = append(unlisted, survivor{file: pkg, typ: "NO RESULTS"})
			continue
		}
		var r result
		if err := json.Unmarshal(data, &r); err != nil {
			fmt.Fprintf(w, "| %s | results unreadable: %v |\n", pkg, err)
			unlisted = append(unlisted, survivor{file: pkg, typ: "NO RESULTS"})
			continue
		}
		count := map[string]int{}
		for _, f := range r.Files {
			file := filepath.ToSlash(filepath.Join(pkg, f.FileName))
			lines := sourceLines(file)
			for _, m := range f.Mutations {
				count[m.Status]++
				if m.Status != "LIVED" {
					continue
				}
				s := survivor{file: file, typ: m.Type, line: m.Line, col: m.Column}
				if m.Line > 0 && m.Line <= len(lines) {
					s.source = strings.TrimSpace(lines[m.Line-1])
				}
				if m.Line > 0 && m.Line < len(lines) {
					s.next = strings.TrimSpace(lines[m.Line])
				}
				if _, ok := listed[s.key()]; ok {
					explained = append(explained, s)
				} else {
					unlisted = append(unlisted, s)
				}
			}
		}
		k, l := count["KILLED"], count["LIVED"]
		t, nv, nc := count["TIMED OUT"], count["NOT VIABLE"], count["NOT COVERED"]
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %s | %s |\n", pkg, k, l, t, nv, nc,
			pct(k+t, k+t+l), pct(k+t+l, k+t+l+nc))
	}
	fmt.Fprintln(w, "\nefficacy: (killed + timed out) / (killed + timed out + lived); mutant coverage: the mutants some test runs")
	fmt.Fprintf(w, "\n%d mutants lived and are listed with their reason in the survivors file\n", len(explained))
	if len(unlisted) == 0 {
		fmt.Fprintln(w, "no other mutant lived")
		return 0
	}
	sort.Slice(unlisted, func(i, j int) bool {
		a, b := unlisted[i], unlisted[j]
		if a.file != b.file {
			return a.file < b.file
		}
		return a.line < b.line || a.line == b.line && a.col < b.col
	})
	fmt.Fprintf(w, "%d mutants lived and are not listed (kill them with a test, or list them with why they may live):\n", len(unlisted))
	for _, s := range unlisted {
		fmt.Fprintf(w, "%s:%d:%d\t%s\t%s\t%s\n", s.file, s.line, s.col, s.typ, s.source, s.next)
	}
	return len(unlisted)
}

func pct(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// sourceLines reads a file's lines (none when it cannot be read).
func sourceLines(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Split(string(data), "\n")
}

// readList reads the survivors file: file, column, type, source line, next
// line and reason, by the first five.
func readList(path string) (map[string]string, error) {
	out := map[string]string{}
	if path == "" {
		return out, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, "\t")
		if len(parts) != 6 || strings.TrimSpace(parts[5]) == "" {
			return nil, fmt.Errorf("%s:%d: want file, column, type, source line, next line and reason, tab-separated", path, n)
		}
		out[strings.Join(parts[:5], "\t")] = parts[5]
	}
	return out, sc.Err()
}
