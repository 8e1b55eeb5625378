// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package hclbound refuses HCL source that is too large or nested too
// deep, before a parser sees it.
//
// hclsyntax and HCL's JSON parser descend recursively, and so does the
// evaluation of what they build: 1 MiB of "[", of "!" or of "1+1+..." takes
// a goroutine past Go's 1 GB stack limit, a fatal error no recover catches
// (a 4 MB nested list crashed `capyctl deploy`, a 1 MB nested manifest the
// custom driver). Check is a linear scan that counts what the parser would
// recurse into: brackets, braces, parentheses, quoted strings, heredocs,
// template interpolations and directives, and the operators of one
// expression (each may become one level of the expression tree). It skips
// comments and the literal text of strings and heredocs, so a "[" in a
// string or a comment counts for nothing.
package hclbound

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

const (
	// MaxBytes bounds an HCL file: job specs, role configurations and
	// custom-engine manifests are a few kilobytes; a job spec of a hundred
	// deployments is well under 100 KiB.
	MaxBytes = 1 << 20
	// MaxDepth bounds the nesting the scan counts. A real job spec nests
	// about five deep (deployment, engine_config, env, a string, an
	// interpolation); Go's stack gives out near a million.
	MaxDepth = 100
)

// ReadFile reads an HCL file, at most one byte more than MaxBytes, so
// that Check can refuse an oversized one without it being read whole.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxBytes+1))
}

// Limits are the bounds Check applies.
type Limits struct {
	// Bytes bounds the source's length.
	Bytes int
	// Depth bounds the nesting.
	Depth int
}

// Check refuses src, the content of filename, when it is over MaxBytes or
// nests deeper than MaxDepth. A name ending in ".json" is scanned as HCL's
// JSON syntax. The diagnostic's subject is where the bound is crossed.
func Check(src []byte, filename string) hcl.Diagnostics {
	return Limits{Bytes: MaxBytes, Depth: MaxDepth}.Check(src, filename)
}

// Check is the package's Check under l.
func (l Limits) Check(src []byte, filename string) hcl.Diagnostics {
	if len(src) > l.Bytes {
		pos := position(src, l.Bytes)
		return diag(filename, pos, "Configuration too large",
			fmt.Sprintf("the file is over %d bytes (%d read); at most %d bytes are read", l.Bytes, len(src), l.Bytes))
	}
	var (
		pos   hcl.Pos
		depth int
		over  bool
	)
	if strings.HasSuffix(filename, ".json") {
		pos, depth, over = scanJSON(src, l.Depth)
	} else {
		s := newScanner(src, rootBody, 0, l.Depth)
		over = s.run()
		pos, depth = s.overAt, s.depth()
	}
	if over {
		return diag(filename, pos, "Configuration nested too deeply",
			fmt.Sprintf("brackets, braces, parentheses, strings, templates and operators nest %d deep here; at most %d are read", depth, l.Depth))
	}
	return nil
}

func diag(filename string, pos hcl.Pos, summary, detail string) hcl.Diagnostics {
	end := pos
	end.Byte++
	end.Column++
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   detail,
		Subject:  &hcl.Range{Filename: filename, Start: pos, End: end},
	}}
}

// position is the line and column of src[off].
func position(src []byte, off int) hcl.Pos {
	p := hcl.InitialPos
	for _, c := range src[:off] {
		p = step(p, c)
	}
	return p
}

// step moves p past the byte c: columns count characters, not bytes.
func step(p hcl.Pos, c byte) hcl.Pos {
	p.Byte++
	switch {
	case c == '\n':
		p.Line++
		p.Column = 1
	case c&0xC0 != 0x80:
		p.Column++
	}
	return p
}

// frameKind is what the scanner is inside of.
type frameKind uint8

const (
	// rootBody is the file's top level: a body of attributes and blocks.
	rootBody frameKind = iota
	// rootTemplate is the content of a JSON string, read as a template.
	rootTemplate
	// expr is inside ( [ { or a ${ / %{ interpolation.
	expr
	// quoted is inside a "quoted template".
	quoted
	// heredoc is inside a <<MARKER heredoc template.
	heredoc
)

// frame is one level the scanner is inside of.
type frame struct {
	kind frameKind
	// closer ends an expr frame: ')', ']' or '}'.
	closer byte
	// marker ends a heredoc.
	marker []byte
	// ops counts the operators of the expression being read in this
	// frame; lastOp is set when the last token was one (a newline after
	// it continues the expression).
	ops    int
	lastOp bool
}

// scanner counts the nesting of native HCL syntax (or of a template).
type scanner struct {
	src   []byte
	i     int
	pos   hcl.Pos
	stack []frame
	// ops is the sum of every frame's ops.
	ops  int
	base int
	max  int
	// inIdent is set inside an identifier, where '-' is a letter.
	inIdent, inWord bool
	overAt          hcl.Pos
}

func newScanner(src []byte, root frameKind, base, max int) *scanner {
	return &scanner{src: src, pos: hcl.InitialPos, stack: []frame{{kind: root}}, base: base, max: max}
}

// depth is the nesting at the scanner's position.
func (s *scanner) depth() int { return s.base + len(s.stack) - 1 + s.ops }

func (s *scanner) adv(n int) {
	for ; n > 0 && s.i < len(s.src); n-- {
		s.pos = step(s.pos, s.src[s.i])
		s.i++
	}
}

func (s *scanner) at(off int) byte {
	if s.i+off < len(s.src) {
		return s.src[s.i+off]
	}
	return 0
}

func (s *scanner) push(f frame) {
	s.top().lastOp = false
	s.stack = append(s.stack, f)
}

func (s *scanner) pop() {
	if len(s.stack) == 1 {
		return
	}
	s.ops -= s.top().ops
	s.stack = s.stack[:len(s.stack)-1]
	s.top().lastOp = false
}

func (s *scanner) top() *frame { return &s.stack[len(s.stack)-1] }

// op counts one operator in the current expression.
func (s *scanner) op() {
	f := s.top()
	f.ops++
	f.lastOp = true
	s.ops++
}

// endExpr ends the current expression (a comma, an assignment, a newline
// between items).
func (s *scanner) endExpr() {
	f := s.top()
	s.ops -= f.ops
	f.ops = 0
	f.lastOp = false
}

// run scans to the end; true when the depth went over max (overAt says
// where).
func (s *scanner) run() bool {
	for s.i < len(s.src) {
		start := s.pos
		switch s.top().kind {
		case rootBody, expr:
			s.expr()
		case quoted:
			s.quoted()
		case heredoc, rootTemplate:
			s.template()
		}
		if s.depth() > s.max {
			s.overAt = start
			return true
		}
	}
	return false
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// expr reads one token's worth of an expression or body.
func (s *scanner) expr() {
	c := s.at(0)
	word := isIdentStart(c) || isDigit(c) || (c == '-' && s.inIdent)
	if !word {
		s.inWord, s.inIdent = false, false
	}
	switch {
	case word:
		if !s.inWord {
			s.inWord, s.inIdent = true, isIdentStart(c)
		}
		s.top().lastOp = false
		s.adv(1)
	case c == ' ' || c == '\t' || c == '\r':
		s.adv(1)
	case c == '\n':
		// A newline ends an item of a body or an object, unless it
		// follows an operator; in ( and [ it is only a space.
		if f := s.top(); !f.lastOp && (f.kind == rootBody || f.closer == '}') {
			s.endExpr()
		}
		s.adv(1)
	case c == '#' || (c == '/' && s.at(1) == '/'):
		for s.i < len(s.src) && s.src[s.i] != '\n' {
			s.adv(1)
		}
	case c == '/' && s.at(1) == '*':
		s.adv(2)
		for s.i < len(s.src) && !(s.src[s.i] == '*' && s.at(1) == '/') {
			s.adv(1)
		}
		s.adv(2)
	case c == '"':
		s.push(frame{kind: quoted})
		s.adv(1)
	case c == '<' && s.at(1) == '<' && s.heredocStart():
	case c == '(':
		s.push(frame{kind: expr, closer: ')'})
		s.adv(1)
	case c == '[':
		s.push(frame{kind: expr, closer: ']'})
		s.adv(1)
	case c == '{':
		s.push(frame{kind: expr, closer: '}'})
		s.adv(1)
	case c == ')' || c == ']' || c == '}':
		if s.top().kind == expr {
			s.pop()
		}
		s.adv(1)
	case c == ',':
		s.endExpr()
		s.adv(1)
	case c == '=':
		// "==", "=>" and the tails of "!=", "<=", ">=" are operators; a
		// lone "=" assigns and starts a new expression.
		if s.at(1) == '=' || s.at(1) == '>' {
			s.op()
			s.adv(2)
		} else if s.i > 0 && bytes.IndexByte([]byte("!<>="), s.src[s.i-1]) >= 0 {
			s.adv(1)
		} else {
			s.endExpr()
			s.adv(1)
		}
	case (c == '&' || c == '|') && s.at(1) == c:
		s.op()
		s.adv(2)
	case bytes.IndexByte([]byte("!-+*/%<>&|?"), c) >= 0:
		s.op()
		s.adv(1)
	default:
		s.adv(1)
	}
}

// heredocStart reads "<<MARKER\n" or "<<-MARKER\n" and pushes the heredoc;
// false (nothing read) when the text is not a heredoc's start.
func (s *scanner) heredocStart() bool {
	j := s.i + 2
	if j < len(s.src) && s.src[j] == '-' {
		j++
	}
	m := j
	for j < len(s.src) && (isIdentStart(s.src[j]) || isDigit(s.src[j]) || s.src[j] == '-') {
		j++
	}
	if j == m {
		return false
	}
	marker := s.src[m:j]
	if j < len(s.src) && s.src[j] == '\r' {
		j++
	}
	if j >= len(s.src) || s.src[j] != '\n' {
		return false
	}
	s.push(frame{kind: heredoc, marker: marker})
	s.adv(j + 1 - s.i)
	return true
}

// interpolation reads "${" or "%{" (pushing an expression) and their
// escapes "$${" and "%%{" (literal text); false when the text is neither.
func (s *scanner) interpolation() bool {
	c := s.at(0)
	if c != '$' && c != '%' {
		return false
	}
	switch {
	case s.at(1) == '{':
		s.push(frame{kind: expr, closer: '}'})
		s.adv(2)
	case s.at(1) == c && s.at(2) == '{':
		s.adv(3)
	default:
		return false
	}
	return true
}

// quoted reads one character of a quoted template.
func (s *scanner) quoted() {
	switch c := s.at(0); {
	case c == '\\':
		s.adv(2)
	case c == '"':
		s.pop()
		s.adv(1)
	case c == '\n':
		// A quoted template ends at the line's end (the parser says it
		// is unterminated): what follows is scanned as the parser reads it.
		s.pop()
	case s.interpolation():
	default:
		s.adv(1)
	}
}

// template reads one character of a heredoc or of a JSON string's
// content; a heredoc ends at a line holding only its marker.
func (s *scanner) template() {
	if f := s.top(); f.kind == heredoc && (s.i == 0 || s.src[s.i-1] == '\n') {
		line := s.src[s.i:]
		if k := bytes.IndexByte(line, '\n'); k >= 0 {
			line = line[:k]
		}
		if bytes.Equal(bytes.TrimSpace(line), f.marker) {
			s.pop()
			s.adv(len(line))
			return
		}
	}
	if !s.interpolation() {
		s.adv(1)
	}
}

// scanJSON counts the nesting of HCL's JSON syntax: arrays and objects,
// plus, for each string, the nesting of the template it holds (HCL
// evaluates JSON strings as templates). An over-deep template is reported
// at its string's start.
func scanJSON(src []byte, max int) (hcl.Pos, int, bool) {
	pos := hcl.InitialPos
	depth := 0
	for i := 0; i < len(src); {
		switch c := src[i]; c {
		case '[', '{':
			depth++
			if depth > max {
				return pos, depth, true
			}
		case ']', '}':
			depth = max0(depth - 1)
		case '"':
			j := i + 1
			for j < len(src) && src[j] != '"' {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(src) {
				return pos, depth, false // unterminated: the parser refuses it
			}
			raw := src[i : j+1]
			if d, over := jsonStringDepth(raw, depth, max); over {
				return pos, d, true
			}
			for ; i < j; i++ {
				pos = step(pos, src[i])
			}
		}
		pos = step(pos, src[i])
		i++
	}
	return pos, depth, false
}

// jsonStringDepth scans a JSON string literal's content as a template.
func jsonStringDepth(raw []byte, base, max int) (int, bool) {
	if !bytes.ContainsAny(raw, `{\`) {
		return base, false
	}
	var content string
	if err := json.Unmarshal(raw, &content); err != nil {
		return base, false // the parser refuses it
	}
	if !strings.Contains(content, "${") && !strings.Contains(content, "%{") {
		return base, false
	}
	s := newScanner([]byte(content), rootTemplate, base, max)
	if s.run() {
		return s.depth(), true
	}
	return base, false
}

func max0(n int) int {
	if n < 0 {
		return 0
	}
	return n
}
