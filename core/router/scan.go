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

// scanMembers reports a chunk that may carry what the relay reads past
// the answer's first content: a member "usage" or "timings", or a string
// "finish_reason" (written "finish_reason":"…"). It walks the chunk's
// colons and looks at the name before each: bytes.Contains of each name
// finds its leading quote at almost every member and costs about four
// times as much. On the same walk it finds where rw's replacements apply
// in p (rewriter.sites): the same places substitution.at finds, since
// each one's value follows a colon. The relay then writes the chunk
// without searching it again. Where it reports figures, the sites are
// left unknown.
func (rw *rewriter) scanMembers(p []byte) bool {
	rw.walked = false
	if !rw.built && rw.served != "" && rw.served != rw.public {
		rw.build()
	}
	if rw.fitsTemplate(p) {
		for i, st := range rw.tplSites {
			if st.at < 0 {
				st.at += len(p) // a site after the content, from the end
			}
			rw.sites[i] = st
		}
		rw.nsites, rw.walked = len(rw.tplSites), true
		return false
	}
	n, content := 0, -1
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
		case 't':
			if content < 0 && k == c && c+1 < len(p) && p[c+1] == '"' && bytes.HasSuffix(p[:k], contentName) {
				content = c + 2
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
				// More sites than it records: the walk goes on for the
				// figures, and write searches the chunk.
				if n < len(rw.sites) {
					rw.sites[n] = site{at: v, sub: j}
				}
				n++
				i = v + len(sb.old)
				break
			}
		}
	}
	if n > len(rw.sites) {
		return false
	}
	rw.nsites, rw.walked = n, true
	rw.keepTemplate(p, content)
	return false
}

var contentName = []byte(`"content"`)

// Chunks of one answer differ mostly in their content: an engine writes
// the same members around it, in the same order, with the same values (the
// answer's id, the model, "finish_reason":null). The rewriter keeps the
// last walked chunk without figures as a template: its bytes up to its
// content string's opening quote (tplPre) and from its closing quote on
// (the rest). A chunk made of the same two parts around a body without a
// quote has the walk's figures and replacement sites of the template:
// the walk reads a member's name from the quote before its colon, so a
// colon in such a body (or one of the parts' that looks back into it) is
// never a member's, and the parts are the same bytes. It is then checked
// with two comparisons and one search for a quote, instead of a walk
// over every colon.

// fitsTemplate reports whether p is the template around another string
// body.
func (rw *rewriter) fitsTemplate(p []byte) bool {
	pre, post := rw.tpl[:rw.tplPre], rw.tpl[rw.tplPre:]
	if len(post) == 0 || len(p) < len(pre)+len(post) || !bytes.HasPrefix(p, pre) || !bytes.HasSuffix(p, post) {
		return false
	}
	return bytes.IndexByte(p[len(pre):len(p)-len(post)], '"') < 0
}

// keepTemplate makes p, walked without figures, the template, where its
// content string starts at content (-1: none).
func (rw *rewriter) keepTemplate(p []byte, content int) {
	if content < 0 {
		return
	}
	end := content
	for {
		i := bytes.IndexByte(p[end:], '"')
		if i < 0 {
			return
		}
		end += i
		bs := 0
		for j := end - 1; j >= content && p[j] == '\\'; j-- {
			bs++
		}
		if bs%2 == 0 {
			break
		}
		end++
	}
	for _, st := range rw.sites[:rw.nsites] {
		if st.at >= content && st.at < end {
			return // never: the walk finds no member inside a string
		}
	}
	rw.tpl = append(append(rw.tpl[:0], p[:content]...), p[end:]...)
	rw.tplPre = content
	rw.tplSites = rw.tplSites[:0]
	for _, st := range rw.sites[:rw.nsites] {
		if st.at >= end {
			st.at -= len(p) // after the content: counted from the end
		}
		rw.tplSites = append(rw.tplSites, st)
	}
}
