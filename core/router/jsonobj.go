// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"strconv"
)

// jsonObj writes one JSON object member by member, in the order written
// (the dialects' events name their type first, as the APIs do).
type jsonObj struct{ b []byte }

func newObj(n int) *jsonObj { return &jsonObj{b: append(make([]byte, 0, n), '{')} }

func (o *jsonObj) key(k string) *jsonObj {
	if len(o.b) > 1 {
		o.b = append(o.b, ',')
	}
	o.b = appendJSONString(o.b, k)
	o.b = append(o.b, ':')
	return o
}

// str adds a string member.
func (o *jsonObj) str(k, v string) *jsonObj {
	o.key(k)
	o.b = appendJSONString(o.b, v)
	return o
}

// strOrNull adds a string member, null when empty.
func (o *jsonObj) strOrNull(k, v string) *jsonObj {
	if v == "" {
		return o.raw(k, nil)
	}
	return o.str(k, v)
}

// int adds a number member.
func (o *jsonObj) int(k string, v int64) *jsonObj {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
	return o
}

// bool adds a boolean member.
func (o *jsonObj) bool(k string, v bool) *jsonObj {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
	return o
}

// raw adds a member of raw JSON; null when empty.
func (o *jsonObj) raw(k string, v []byte) *jsonObj {
	o.key(k)
	if len(v) == 0 {
		o.b = append(o.b, "null"...)
	} else {
		o.b = append(o.b, v...)
	}
	return o
}

// any adds a member encoded by encoding/json.
func (o *jsonObj) any(k string, v any) *jsonObj {
	b, err := json.Marshal(v)
	if err != nil {
		b = nil
	}
	return o.raw(k, b)
}

// bytes ends the object.
func (o *jsonObj) bytes() []byte { return append(o.b, '}') }
