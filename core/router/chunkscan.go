// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// Reading a streamed chunk without decoding it.
//
// A relayed stream reads four things from the engine's chunks: the answer's
// ID (to replace it), whether a choice carries output (first content, the
// decode rate), whether one finished, and the usage and timings of the last
// chunk. encoding/json found them at a cost of about 10 µs and several KiB
// of stack per chunk decoded (the stack of every open stream's goroutine,
// which grows once and stays grown; decodeChunk's comment). scanChunkFacts
// walks the chunk's bytes once, by the members' exact names, holding no
// buffer and next to no stack; it gives up (ok false) on a chunk that is
// not one well-formed object in the shape it knows, which the caller then
// decodes as before.

// chunkFacts is what scanChunkFacts found in a chunk.
type chunkFacts struct {
	id       []byte // the top-level "id" string as written, without its quotes (nil: none)
	idDecode bool   // id has an escape or is not UTF-8: decode it before use
	choices  int    // the choices
	content  int    // the choices that carry output (text, reasoning, a refusal, a tool call)
	finish   bool   // a choice has a finish reason
	usage    []byte // the usage object as written (nil: absent or null)
	timings  []byte // the timings as written (nil: absent)
}

// scanChunkFacts reads a chunk's facts; ok is false when the chunk is not
// one JSON object whose members the scan understands.
func scanChunkFacts(p []byte, f *chunkFacts) bool {
	*f = chunkFacts{}
	return eachRawMember(p, func(key, v []byte) bool {
		switch string(key) {
		case "id":
			if len(v) < 2 || v[0] != '"' {
				return v[0] == 'n' // null: no id
			}
			f.id = v[1 : len(v)-1]
			f.idDecode = bytes.IndexByte(f.id, '\\') >= 0 || !utf8.Valid(f.id)
		case "choices":
			if v[0] == 'n' {
				return true
			}
			if v[0] != '[' {
				return false
			}
			return eachRawElement(v, func(c []byte) bool {
				f.choices++
				return scanChoice(c, f)
			})
		case "usage":
			if v[0] == '{' {
				f.usage = v
			} else if v[0] != 'n' {
				return false
			}
		case "timings":
			f.timings = v
		}
		return true
	})
}

// scanChoice reads one choice: output in its delta or text, and a finish
// reason.
func scanChoice(c []byte, f *chunkFacts) bool {
	if len(c) == 0 || c[0] != '{' {
		return false
	}
	output := false
	ok := eachRawMember(c, func(key, v []byte) bool {
		switch string(key) {
		case "delta":
			if v[0] == 'n' {
				return true
			}
			if v[0] != '{' {
				return false
			}
			return eachRawMember(v, func(key, v []byte) bool {
				switch string(key) {
				case "content", "reasoning_content", "reasoning", "refusal":
					switch {
					case v[0] == '"':
						output = output || len(v) > 2
					case v[0] != 'n':
						return false
					}
				case "tool_calls":
					switch {
					case v[0] == '[':
						output = output || !isEmptyArray(v)
					case v[0] != 'n':
						return false
					}
				}
				return true
			})
		case "text":
			switch {
			case v[0] == '"':
				output = output || len(v) > 2
			case v[0] != 'n':
				return false
			}
		case "finish_reason":
			if v[0] != 'n' {
				f.finish = true
			}
		}
		return true
	})
	if output {
		f.content++
	}
	return ok
}

// eachRawMember calls fn with every member of the JSON object in b (its
// name as written, without quotes, and its value as written, never empty);
// false when b is not one object or fn returns false. Values are
// delimited, not validated: a caller reads only what it understands.
func eachRawMember(b []byte, fn func(key, v []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		kend, ok := endString(b, i)
		if !ok {
			return false
		}
		key := b[i+1 : kend-1]
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		vend, ok := endValue(b, i)
		if !ok || !fn(key, b[i:vend]) {
			return false
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case '}':
			return skipSpace(b, i+1) == len(b)
		case ',':
			i = skipSpace(b, i+1)
		default:
			return false
		}
	}
}

// eachRawElement calls fn with every element of the JSON array in b; false
// when b is not one array or fn returns false.
func eachRawElement(b []byte, fn func(v []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		end, ok := endValue(b, i)
		if !ok || !fn(b[i:end]) {
			return false
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ']':
			return skipSpace(b, i+1) == len(b)
		case ',':
			i = skipSpace(b, i+1)
		default:
			return false
		}
	}
}

// endString returns the index after the string that starts at b[i] (a
// quote); false when it does not end.
func endString(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '\\':
			j++
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return 0, false
		}
	}
	return 0, false
}

// endValue returns the index after the value that starts at b[i]; false
// when there is none, or an object or array does not end.
func endValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return endString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, ok := endString(b, j)
				if !ok {
					return 0, false
				}
				j = end - 1
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
	case ',', '}', ']', ':':
		return 0, false
	default: // a number, true, false or null
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j, true
			}
			j++
		}
		return j, true
	}
}

// jsonInt reads a JSON number that is an integer; false for anything else.
func jsonInt(v []byte) (int64, bool) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// jsonFloat reads a JSON number; false for anything else.
func jsonFloat(v []byte) (float64, bool) {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	for _, c := range v {
		if (c < '0' || c > '9') && c != '-' && c != '+' && c != '.' && c != 'e' && c != 'E' {
			return 0, false // not JSON: Go's hexadecimal, underscores, Inf
		}
	}
	x, err := strconv.ParseFloat(string(v), 64)
	return x, err == nil
}
