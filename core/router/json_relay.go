// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/capyctl/capyctl/core/structs"
)

// relayJSON relays a whole JSON answer (a decision, embeddings, a rerank, or a chat
// answer the engine did not stream) with the request ID, the public model name and
// capyctl.metrics. The answer is spliced, not decoded and encoded again:
// one scan finds its top-level members (topLevel), only usage and timings
// are decoded, and the output is the engine's bytes with three members
// replaced or added.
func (q *request) relayJSON(call *engineCall) {
	data, err := readBody(call.Resp, 64<<20)
	if err != nil {
		call.finish(false)
		q.endAt = time.Now()
		c := q.cause(err)
		if c == nil {
			c = err
		}
		q.cutEnd(c)
		return
	}
	call.finish(true)
	q.endAt = time.Now()
	q.firstContent = q.endAt
	q.done()
	if q.dl != nil {
		// dialect: the whole answer in the API's shape.
		if err := q.dl.whole(q, data); err != nil && !q.headersSent {
			q.outcome = OutcomeEngineError
			q.fail(structs.Errf(structs.CodeEngineError, "the engine's answer does not parse: %v", err))
		}
		return
	}
	out, ok := q.spliceJSON(data)
	if !ok {
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) != nil {
			q.status = 200
			q.headersSent = true
			h := q.w.Header()
			h.Set("Content-Type", call.Resp.Header.Get("Content-Type"))
			q.w.WriteHeader(200)
			_ = q.write(data)
			return
		}
		out = q.rebuildJSON(m)
	}
	q.setWriteDeadline()
	h := q.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	q.w.WriteHeader(200)
	q.status = 200
	q.headersSent = true
	_ = q.write(out)
}

// readBody reads a whole answer body of at most limit bytes, sized by its
// Content-Length when it has one.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	if n := resp.ContentLength; n >= 0 && n <= limit {
		b := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}

// spliceJSON is the answer with its top-level "id" set to the request ID
// (an embeddings answer without one stays without),
// "model" (where present, always for a decision) to the public name,
// "rid" removed and "capyctl" added; usage and timings are read. ok is
// false for an answer the splice does not handle (not one object, no id
// where one is needed, a "capyctl" member of its own).
func (q *request) spliceJSON(data []byte) ([]byte, bool) {
	var buf [16]member
	ms, ok := topLevel(data, buf[:0])
	if !ok {
		return nil, false
	}
	var id, model, rid, usage, timings = -1, -1, -1, -1, -1
	for i, m := range ms {
		switch string(m.key) {
		case "id":
			id = i
		case "model":
			model = i
		case "rid":
			rid = i
		case "usage":
			usage = i
		case "timings":
			timings = i
		case "capyctl":
			return nil, false
		}
	}
	// An embeddings answer has no id in OpenAI's shape (SGLang's and
	// llama-server's have none; vLLM's has one), nor has llama-server's
	// rerank answer: none is added.
	if (id < 0 && !pooling(q.api)) || (model < 0 && q.api == structs.APIDecisions) {
		return nil, false
	}
	if usage >= 0 {
		q.usage.parse(data[ms[usage].val:ms[usage].end])
	}
	if timings >= 0 {
		q.timings.parse(data[ms[timings].val:ms[timings].end])
	}
	q.contentN = q.usage.completion
	out := make([]byte, 0, len(data)+len(q.id)+len(q.model)+320)
	out = append(out, '{')
	first := true
	for i, m := range ms {
		if i == rid {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		switch i {
		case id:
			out = append(out, `"id":`...)
			out = appendJSONString(out, q.id)
		case model:
			out = append(out, `"model":`...)
			out = appendJSONString(out, q.model)
		default:
			out = append(out, data[m.start:m.end]...)
		}
	}
	out = append(out, `,"capyctl":{"metrics":`...)
	out = q.appendMetrics(out)
	out = append(out, "}}\n"...)
	return out, true
}

// rebuildJSON is spliceJSON for an answer it could not handle, decoded.
func (q *request) rebuildJSON(m map[string]json.RawMessage) []byte {
	if _, ok := m["id"]; ok || !pooling(q.api) {
		m["id"], _ = json.Marshal(q.id)
	}
	if _, ok := m["model"]; ok || q.api == structs.APIDecisions {
		m["model"], _ = json.Marshal(q.model)
	}
	if u, ok := m["usage"]; ok {
		q.usage.parse(u)
	}
	if t, ok := m["timings"]; ok {
		q.timings.parse(t)
	}
	delete(m, "rid")
	q.contentN = q.usage.completion
	cap := append([]byte(`{"metrics":`), q.appendMetrics(nil)...)
	m["capyctl"] = append(cap, '}')
	out, _ := json.Marshal(m)
	return append(out, '\n')
}

// appendJSONString appends s as a JSON string, without allocating:
// quotes, backslashes and control characters escaped, invalid UTF-8
// replaced by U+FFFD and U+2028/U+2029 escaped, as encoding/json does (it
// also escapes <, > and &, which JSON does not need).
func appendJSONString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexd[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
