// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

// member is one top-level member of a JSON object: data[start:end] is
// `"key":value` and data[val:end] the value.
type member struct {
	key             []byte // the key as written, without its quotes
	start, val, end int
}

// topLevel lists the top-level members of a JSON object in one pass,
// without decoding anything: nested values are skipped by counting
// brackets outside strings. ok is false when data is not one object the
// scan understands (the caller then decodes it in full). It trusts the
// engine to send valid JSON; anything odd is "not ok", never a panic.
func topLevel(data []byte, into []member) ([]member, bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, false
	}
	i++
	out := into[:0]
	for {
		i = skipSpace(data, i)
		if i >= len(data) {
			return nil, false
		}
		if data[i] == '}' {
			if skipSpace(data, i+1) != len(data) {
				return nil, false
			}
			return out, true
		}
		if len(out) > 0 {
			if data[i] != ',' {
				return nil, false
			}
			i = skipSpace(data, i+1)
		}
		start := i
		kend, ok := skipString(data, i)
		if !ok {
			return nil, false
		}
		key := data[i+1 : kend-1]
		i = skipSpace(data, kend)
		if i >= len(data) || data[i] != ':' {
			return nil, false
		}
		val := skipSpace(data, i+1)
		end, ok := skipValue(data, val)
		if !ok {
			return nil, false
		}
		out = append(out, member{key: key, start: start, val: val, end: end})
		i = end
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, ok := skipString(b, j)
				if !ok {
					return 0, false
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	}
	j := i
scalar:
	for ; j < len(b); j++ {
		switch b[j] {
		case ',', '}', ']', ' ', '\n', '\r', '\t':
			break scalar
		}
	}
	return j, j > i
}
