// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
)

// rewriter replaces the engine's answer ID with CapyCTL's request ID and
// the served model name with the public one, without decoding the chunk.
type rewriter struct {
	newID, public, served string
	oldID                 string
	pairs                 [][2][]byte
}

func (rw *rewriter) setOldID(id string) {
	rw.oldID = id
	rw.build()
}

func (rw *rewriter) build() {
	rw.pairs = rw.pairs[:0]
	q := func(s string) []byte { b, _ := json.Marshal(s); return b }
	if rw.oldID != "" && rw.oldID != rw.newID {
		for _, sep := range []string{":", ": "} {
			rw.pairs = append(rw.pairs, [2][]byte{
				append([]byte(`"id"`+sep), q(rw.oldID)...),
				append([]byte(`"id"`+sep), q(rw.newID)...),
			})
		}
	}
	if rw.served != "" && rw.served != rw.public {
		for _, sep := range []string{":", ": "} {
			rw.pairs = append(rw.pairs, [2][]byte{
				append([]byte(`"model"`+sep), q(rw.served)...),
				append([]byte(`"model"`+sep), q(rw.public)...),
			})
		}
	}
}

// write writes payload with the replacements.
func (rw *rewriter) write(q *request, payload []byte) error {
	if rw.pairs == nil && rw.served != "" && rw.served != rw.public {
		rw.build()
	}
	rest := payload
	for len(rest) > 0 {
		at, which := -1, -1
		for i, p := range rw.pairs {
			if j := bytes.Index(rest, p[0]); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			return q.write(rest)
		}
		if err := q.write(rest[:at]); err != nil {
			return err
		}
		if err := q.write(rw.pairs[which][1]); err != nil {
			return err
		}
		rest = rest[at+len(rw.pairs[which][0]):]
	}
	return nil
}
