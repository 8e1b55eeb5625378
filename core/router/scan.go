// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
)

// scan reads what the router needs from a streamed chunk (first content,
// usage, finish) and says whether to relay it: a usage-only chunk the
// client did not ask for is dropped. Most chunks need no reading at all:
// once the answer's ID and first content are known, a chunk without usage,
// a finish reason or timings is content. The others are read by
// scanChunkFacts, without decoding; only a chunk in a shape it does not
// know is decoded (scanChunk), off the relay's goroutine for a stream taken
// over from net/http (see decodeOff).
func (q *request) scan(payload []byte, rw *rewriter) bool {
	if rw.oldID != "" && q.contentN > 0 && !rw.scanMembers(payload) {
		q.contentN++
		q.contentSeen = true
		return true
	}
	var f chunkFacts
	if scanChunkFacts(payload, &f) && !f.idDecode {
		return q.applyFacts(&f, true, rw)
	}
	if q.cc != nil {
		return q.decodeOff(payload, rw)
	}
	return q.scanChunk(payload, rw)
}

// decodeOff runs scanChunk on a goroutine of its own and waits for it.
// IMPORTANT: encoding/json needs several KiB of stack; a taken-over stream
// waits on a goroutine that starts at 2 KiB, and a stack that grew once
// stays grown until a collection shrinks it (only while the goroutine uses
// under a quarter of it). Decoding the stream's chunks there would leave
// every open stream with a 4 to 8 KiB stack; the short-lived goroutine's
// stack is freed when it ends. Only chunks scanChunkFacts cannot read come
// here.
func (q *request) decodeOff(payload []byte, rw *rewriter) bool {
	done := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- panicked{p} // re-raised on the relay's goroutine
			}
		}()
		done <- q.scanChunk(payload, rw)
	}()
	v := <-done
	if p, ok := v.(panicked); ok {
		panic(p.v)
	}
	return v.(bool)
}

// panicked carries a panic from decodeOff's goroutine.
type panicked struct{ v any }

// scanChunk is scan for a chunk that needs decoding.
func (q *request) scanChunk(payload []byte, rw *rewriter) bool {
	var f chunkFacts
	ok := decodedFacts(payload, &f)
	return q.applyFacts(&f, ok, rw)
}

// decodedFacts is scanChunkFacts by decoding the chunk (usage and timings
// are left to applyFacts to decode).
func decodedFacts(payload []byte, f *chunkFacts) bool {
	var c chunkHead
	if decodeChunk(payload, &c) != nil {
		return false
	}
	*f = chunkFacts{id: []byte(c.ID), choices: len(c.Choices)}
	for _, ch := range c.Choices {
		if ch.hasContent() {
			f.content++
		}
		if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
			f.finish = true
		}
	}
	if len(c.Usage) > 0 && string(c.Usage) != "null" {
		f.usage = c.Usage
	}
	if len(c.Timings) > 0 {
		f.timings = c.Timings
	}
	return true
}

// applyFacts records what a chunk says (ok false: a chunk that could not
// be read, relayed as content) and says whether to relay it.
func (q *request) applyFacts(f *chunkFacts, ok bool, rw *rewriter) bool {
	if ok && (rw.oldID == "" || q.contentN == 0) {
		// The answer's opening chunks: its ID, and its first content.
		if rw.oldID == "" && len(f.id) > 0 {
			rw.setOldID(string(f.id))
		}
		if f.content > 0 {
			q.contentN += int64(f.content)
			q.contentSeen = true
		}
		if f.finish {
			q.sawFinish = true
		}
		if f.usage != nil {
			q.usage.parse(f.usage)
		}
		if f.timings != nil {
			q.timings.parse(f.timings)
		}
		return !(f.choices == 0 && f.usage != nil && !q.usageOpt)
	}
	q.contentN++
	q.contentSeen = true
	if !ok {
		return true
	}
	if f.content == 0 {
		q.contentN--
	}
	if f.finish {
		q.sawFinish = true
	}
	if f.timings != nil {
		q.timings.parse(f.timings)
	}
	if f.usage != nil {
		q.usage.parse(f.usage)
	}
	return !(f.choices == 0 && f.usage != nil && !q.usageOpt)
}

var (
	usageKey   = []byte(`"usage"`)
	finishKey  = []byte(`"finish_reason":"`)
	timingsKey = []byte(`"timings"`)
	finishName = []byte(`"finish_reason"`)
)

// carriesFigures reports a chunk that may carry what the relay reads past
// the answer's first content: a member "usage" or "timings", or a string
// "finish_reason" (written "finish_reason":"…"). It walks the chunk's
// colons and looks at the name before each: bytes.Contains of each name
// finds its leading quote at almost every member and costs about four
// times as much.
func carriesFigures(p []byte) bool {
	var rw rewriter
	return rw.scanMembers(p)
}

// scanMembers is carriesFigures, which also finds, on the same walk, where
// rw's replacements apply in p (rewriter.sites): the same places
// substitution.at finds, since each one's value follows a colon. The
// relay then writes the chunk without searching it again. Where it
// reports figures, the sites are left unknown.
func (rw *rewriter) scanMembers(p []byte) bool {
	rw.walked = false
	if !rw.built && rw.served != "" && rw.served != rw.public {
		rw.build()
	}
	n := 0
	for i := 0; i < len(p); {
		j := bytes.IndexByte(p[i:], ':')
		if j < 0 {
			break
		}
		c := i + j
		i = c + 1
		k := c
		for k > 0 && (p[k-1] == ' ' || p[k-1] == '\t' || p[k-1] == '\n' || p[k-1] == '\r') {
			k--
		}
		if k < 2 || p[k-1] != '"' {
			continue
		}
		switch p[k-2] {
		case 'e':
			if bytes.HasSuffix(p[:k], usageKey) {
				return true
			}
		case 's':
			if bytes.HasSuffix(p[:k], timingsKey) {
				return true
			}
		case 'n':
			if k == c && c+1 < len(p) && p[c+1] == '"' && bytes.HasSuffix(p[:k], finishName) {
				return true
			}
		}
		if k != c || len(rw.subs) == 0 {
			continue
		}
		// A replacement's member: its name right before the colon, then its
		// old value after the colon and at most one space.
		v := c + 1
		if v < len(p) && p[v] == ' ' {
			v++
		}
		for j := range rw.subs {
			sb := &rw.subs[j]
			if bytes.HasPrefix(p[v:], sb.old) && bytes.HasSuffix(p[:c+1], sb.key) {
				if n == len(rw.sites) {
					return false // more than it records: write searches
				}
				rw.sites[n] = site{at: v, sub: j}
				n++
				i = v + len(sb.old)
				break
			}
		}
	}
	rw.nsites, rw.walked = n, true
	return false
}
