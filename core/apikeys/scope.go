// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"fmt"
	"strings"
)

// Scope is the models a key may use: names and globs. In a glob, '*'
// matches any run of characters (a '/' too: model names such as
// "org/model" are common) and '?' one character; anything else matches
// itself. A nil Scope allows every model.
type Scope struct {
	patterns []string
}

// NewScope compiles a key's models; an empty list allows every model.
func NewScope(models []string) (*Scope, error) {
	if len(models) == 0 {
		return nil, nil
	}
	out := &Scope{}
	for _, m := range models {
		m = strings.TrimSpace(m)
		if m == "" {
			return nil, fmt.Errorf("an empty model name or glob")
		}
		if len(m) > 256 {
			return nil, fmt.Errorf("model glob %q is over 256 characters", m[:32]+"…")
		}
		out.patterns = append(out.patterns, m)
	}
	return out, nil
}

// Allows reports whether the scope allows model.
func (s *Scope) Allows(model string) bool {
	if s == nil {
		return true
	}
	for _, p := range s.patterns {
		if glob(p, model) {
			return true
		}
	}
	return false
}

// glob matches name against pattern ('*' any run, '?' one byte), in
// linear time (one backtracking point, the last star).
func glob(pattern, name string) bool {
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == name[n]):
			p++
			n++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
