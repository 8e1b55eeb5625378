// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"time"
)

// scan reads what the router needs from a streamed chunk (first content,
// usage, finish) and says whether to relay it: a usage-only chunk the
// client did not ask for is dropped. Most chunks need no decoding: once
// the answer's ID and first content are known, a chunk without usage, a
// finish reason or timings is content. The few that need decoding are
// decoded by scanChunk, off the relay's goroutine for a stream taken over
// from net/http (see decodeOff).
func (q *request) scan(payload []byte, rw *rewriter) bool {
	if rw.oldID != "" && q.contentN > 0 && !bytes.Contains(payload, usageKey) &&
		!bytes.Contains(payload, finishKey) && !bytes.Contains(payload, timingsKey) {
		q.contentN++
		q.lastContent = time.Now()
		return true
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
// under a quarter of it). Decoding the stream's first chunks there would
// leave every open stream with a 4 to 8 KiB stack; the short-lived
// goroutine's stack is freed when it ends.
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

// scanChunk is scan for a chunk that may need decoding.
func (q *request) scanChunk(payload []byte, rw *rewriter) bool {
	if rw.oldID == "" || q.contentN == 0 {
		var c chunkHead
		if decodeChunk(payload, &c) == nil {
			if rw.oldID == "" && c.ID != "" {
				rw.setOldID(c.ID)
			}
			for _, ch := range c.Choices {
				if ch.hasContent() {
					q.contentN++
					q.lastContent = time.Now()
				}
				if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
					q.sawFinish = true
				}
			}
			if len(c.Usage) > 0 && string(c.Usage) != "null" {
				q.usage.parse(c.Usage)
				if len(c.Choices) == 0 && !q.usageOpt {
					return false
				}
			}
			if len(c.Timings) > 0 {
				q.timings.parse(c.Timings)
			}
			return true
		}
	}
	q.contentN++
	q.lastContent = time.Now()
	if bytes.Contains(payload, usageKey) || bytes.Contains(payload, finishKey) || bytes.Contains(payload, timingsKey) {
		var c chunkHead
		if decodeChunk(payload, &c) == nil {
			empty := true
			for _, ch := range c.Choices {
				if ch.hasContent() {
					empty = false
				}
				if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
					q.sawFinish = true
				}
			}
			if empty {
				q.contentN--
			}
			if len(c.Timings) > 0 {
				q.timings.parse(c.Timings)
			}
			if len(c.Usage) > 0 && string(c.Usage) != "null" {
				q.usage.parse(c.Usage)
				if len(c.Choices) == 0 && !q.usageOpt {
					return false
				}
			}
		}
	}
	return true
}

var (
	usageKey   = []byte(`"usage"`)
	finishKey  = []byte(`"finish_reason":"`)
	timingsKey = []byte(`"timings"`)
)
