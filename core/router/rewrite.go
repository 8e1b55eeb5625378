// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
)

// rewriter replaces the engine's answer ID with CapyCTL's request ID and
// the served model name with the public one, without decoding the chunk:
// it looks for the old value as a JSON string ("chatcmpl-…") and replaces
// it where it is the value of an "id" (or "model") member, written as
// `"id":` or `"id": `. One search per value and chunk, wherever the engine
// puts its members.
type rewriter struct {
	newID, public, served string
	oldID                 string
	subs                  []substitution
	built                 bool
	// sites are where the replacements apply in the chunk scanMembers
	// walked last (nsites of them), for the write that follows; walked
	// says they are known (otherwise write searches).
	sites  [4]site
	nsites int
	walked bool
	// tpl is the last walked chunk without figures around its content
	// string: its first tplPre bytes come before the string's body, the
	// rest from the closing quote on; tplSites are its replacement sites,
	// those after the content counted from the chunk's end (negative)
	// (scanMembers, fitsTemplate).
	tpl      []byte
	tplPre   int
	tplSites []site
}

// site is where a replacement applies: the old value's index and which
// substitution.
type site struct{ at, sub int }

// substitution replaces old (a quoted JSON string) with new where it is
// the value of the member key.
type substitution struct {
	key      []byte // `"id":`
	old, new []byte // quoted
	// tail is what the search looks for: old's last bytes, whose first
	// byte (an ID's last characters) is rarer in a chunk than the quote
	// old starts with, which bytes.Index would stop at in every member.
	tail []byte
}

// maxTail is the longest tail a substitution searches for.
const maxTail = 12

func newSubstitution(key, old, new []byte) substitution {
	return substitution{key: key, old: old, new: new, tail: old[max(len(old)-maxTail, 0):]}
}

func (rw *rewriter) setOldID(id string) {
	rw.oldID = id
	rw.build()
}

func (rw *rewriter) build() {
	rw.subs = rw.subs[:0]
	rw.tpl, rw.tplPre, rw.tplSites = rw.tpl[:0], 0, rw.tplSites[:0] // its sites were the old substitutions
	rw.built = true
	q := func(s string) []byte { b, _ := json.Marshal(s); return b }
	if rw.oldID != "" && rw.oldID != rw.newID {
		rw.subs = append(rw.subs, newSubstitution([]byte(`"id":`), q(rw.oldID), q(rw.newID)))
	}
	if rw.served != "" && rw.served != rw.public {
		rw.subs = append(rw.subs, newSubstitution([]byte(`"model":`), q(rw.served), q(rw.public)))
	}
}

// at returns where in p the next replacement of s starts (the old value's
// index; -1 when none), searching from from.
func (s *substitution) at(p []byte, from int) int {
	for next := from; next < len(p); {
		i := bytes.Index(p[next:], s.tail)
		if i < 0 {
			return -1
		}
		end := next + i + len(s.tail)
		next += i + 1
		start := end - len(s.old)
		if start < from || !bytes.Equal(p[start:end], s.old) {
			continue
		}
		// The member's name, then a colon and at most one space.
		k := start
		if k > 0 && p[k-1] == ' ' {
			k--
		}
		if k >= len(s.key) && bytes.Equal(p[k-len(s.key):k], s.key) {
			return start
		}
	}
	return -1
}

// write writes payload with the replacements.
func (rw *rewriter) write(q *request, payload []byte) error {
	if !rw.built && rw.served != "" && rw.served != rw.public {
		rw.build()
	}
	walked := rw.walked
	rw.walked = false
	if len(rw.subs) == 0 {
		return q.write(payload)
	}
	if walked {
		// scanMembers walked this chunk: the sites are known.
		done := 0
		for _, st := range rw.sites[:rw.nsites] {
			s := &rw.subs[st.sub]
			if err := q.write(payload[done:st.at]); err != nil {
				return err
			}
			if err := q.write(s.new); err != nil {
				return err
			}
			done = st.at + len(s.old)
		}
		return q.write(payload[done:])
	}
	// next[i] is where subs[i] applies next (-1: nowhere more).
	var next [2]int
	for i := range rw.subs {
		next[i] = rw.subs[i].at(payload, 0)
	}
	done := 0
	for {
		which := -1
		for i := range rw.subs {
			if next[i] >= 0 && (which < 0 || next[i] < next[which]) {
				which = i
			}
		}
		if which < 0 {
			return q.write(payload[done:])
		}
		s := &rw.subs[which]
		at := next[which]
		if err := q.write(payload[done:at]); err != nil {
			return err
		}
		if err := q.write(s.new); err != nil {
			return err
		}
		done = at + len(s.old)
		for i := range rw.subs {
			if next[i] >= 0 && next[i] < done {
				next[i] = rw.subs[i].at(payload, done)
			}
		}
		next[which] = s.at(payload, done)
	}
}
