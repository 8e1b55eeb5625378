// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
)

// member is one top-level member of a JSON object: data[start:end] is
// `"key":value` and data[val:end] the value.
type member struct {
	key             []byte // the key as written, without its quotes
	start, val, end int
}

// topLevel lists the top-level members of a JSON object without decoding
// anything: one validity pass (no allocation), then nested values are
// skipped with eachMember's scanners. ok is false when data is not one
// valid object, or has a member name with an escape (the caller then
// decodes it in full).
func topLevel(data []byte, into []member) ([]member, bool) {
	if !json.Valid(data) {
		return nil, false
	}
	i := skipSpace(data, 0)
	if data[i] != '{' {
		return nil, false
	}
	i = skipSpace(data, i+1)
	out := into[:0]
	if data[i] == '}' {
		return out, true
	}
	for {
		start := i
		kend := skipString(data, i)
		key := data[i+1 : kend-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, false
		}
		i = skipSpace(data, kend)
		val := skipSpace(data, i+1) // after the colon
		end := skipValue(data, val)
		out = append(out, member{key: key, start: start, val: val, end: end})
		i = skipSpace(data, end)
		if data[i] == '}' {
			return out, true
		}
		i = skipSpace(data, i+1) // after the comma
	}
}
