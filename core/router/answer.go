// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// chunkHead is the part of a streamed chat chunk the router reads
// (decodeChunk fills it).
type chunkHead struct {
	ID                string            `json:"id"`
	Created           int64             `json:"created"`
	SystemFingerprint json.RawMessage   `json:"system_fingerprint"`
	RawChoices        []json.RawMessage `json:"choices"`
	Usage             json.RawMessage   `json:"usage"`
	Timings           json.RawMessage   `json:"timings"`
	Choices           []chunkChoice     `json:"-"`
}

// decodeChunk decodes a streamed chunk one level at a time: the chunk,
// then each choice (with its delta), then each tool call. IMPORTANT:
// encoding/json's stack grows by about 1 KiB per nested object, and the
// chunks of a stream kept on net/http are decoded on its handler's
// goroutine, whose stack every open stream pays for (see sseLoop);
// decoding the whole nesting at once pushed that stack from 8 to 16 KiB.
// A stream taken over from net/http decodes off its goroutine (decodeOff).
func decodeChunk(payload []byte, c *chunkHead) error {
	if err := json.Unmarshal(payload, c); err != nil {
		return err
	}
	if len(c.RawChoices) == 0 {
		return nil
	}
	c.Choices = make([]chunkChoice, len(c.RawChoices))
	for i, raw := range c.RawChoices {
		ch := &c.Choices[i]
		if err := json.Unmarshal(raw, ch); err != nil {
			return err
		}
		d := &ch.Delta
		if len(d.RawToolCalls) == 0 {
			continue
		}
		d.ToolCalls = make([]toolCallDelta, len(d.RawToolCalls))
		for j, rt := range d.RawToolCalls {
			if err := json.Unmarshal(rt, &d.ToolCalls[j]); err != nil {
				return err
			}
		}
	}
	return nil
}

type chunkChoice struct {
	Index        int             `json:"index"`
	Delta        delta           `json:"delta"`
	Text         *string         `json:"text"` // a text completion's piece (/v1/completions)
	FinishReason json.RawMessage `json:"finish_reason"`
	Logprobs     json.RawMessage `json:"logprobs"`
}

// delta is a chunk's piece of the message.
type delta struct {
	Role             string            `json:"role"`
	Content          *string           `json:"content"`
	ReasoningContent *string           `json:"reasoning_content"`
	Reasoning        *string           `json:"reasoning"`
	Refusal          *string           `json:"refusal"`
	RawToolCalls     []json.RawMessage `json:"tool_calls"`
	ToolCalls        []toolCallDelta   `json:"-"`
}

type toolCallDelta struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// hasContent reports output: the delta's, or a text completion's text.
func (ch *chunkChoice) hasContent() bool {
	return ch.Delta.hasContent() || (ch.Text != nil && *ch.Text != "")
}

// hasContent reports output beyond the role: text, reasoning, a refusal
// or a tool call. A role-only opening chunk is not output.
func (d *delta) hasContent() bool {
	for _, s := range []*string{d.Content, d.ReasoningContent, d.Reasoning, d.Refusal} {
		if s != nil && *s != "" {
			return true
		}
	}
	return len(d.ToolCalls) > 0
}

// usageFigures are the engine's token counts.
type usageFigures struct {
	known      bool
	prompt     int64
	completion int64
	cached     int64
	cachedOK   bool
	raw        json.RawMessage
}

// usageValues are a usage object's counts (has: present and not null).
type usageValues struct {
	prompt, total, completion, cached             int64
	hasPrompt, hasTotal, hasCompletion, hasCached bool
}

func (u *usageFigures) parse(raw json.RawMessage) {
	v, ok := scanUsage(raw)
	if !ok {
		if v, ok = decodeUsage(raw); !ok {
			return
		}
	}
	if !v.hasPrompt && !v.hasCompletion && v.hasTotal {
		// vLLM's rerank usage counts only total_tokens: all of it is
		// input (a pooling model generates nothing).
		v.prompt, v.hasPrompt = v.total, true
	}
	if !v.hasPrompt {
		return
	}
	u.known = true
	u.prompt = v.prompt
	if v.hasCompletion {
		u.completion = v.completion
	}
	if v.hasCached {
		u.cached, u.cachedOK = v.cached, true
	}
	u.raw = append(u.raw[:0], raw...)
}

// scanUsage reads a usage object's counts without decoding it (a stream's
// relay reads one on its own goroutine: see decodeChunk); false when it
// is in a shape that needs decoding.
func scanUsage(raw []byte) (usageValues, bool) {
	var v usageValues
	count := func(val []byte, n *int64, has *bool) bool {
		if val[0] == 'n' {
			*n, *has = 0, false
			return string(val) == "null"
		}
		x, ok := jsonInt(val)
		*n, *has = x, ok
		return ok
	}
	ok := eachRawMember(raw, func(k, val []byte) bool {
		switch string(k) {
		case "prompt_tokens":
			return count(val, &v.prompt, &v.hasPrompt)
		case "total_tokens":
			return count(val, &v.total, &v.hasTotal)
		case "completion_tokens":
			return count(val, &v.completion, &v.hasCompletion)
		case "prompt_tokens_details":
			v.cached, v.hasCached = 0, false
			if val[0] == 'n' {
				return string(val) == "null"
			}
			return eachRawMember(val, func(k, val []byte) bool {
				if string(k) != "cached_tokens" {
					return true
				}
				return count(val, &v.cached, &v.hasCached)
			})
		}
		return true
	})
	return v, ok
}

// decodeUsage is scanUsage by decoding.
func decodeUsage(raw []byte) (usageValues, bool) {
	var d struct {
		PromptTokens        *int64 `json:"prompt_tokens"`
		TotalTokens         *int64 `json:"total_tokens"`
		CompletionTokens    *int64 `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if json.Unmarshal(raw, &d) != nil {
		return usageValues{}, false
	}
	var v usageValues
	set := func(p *int64, n *int64, has *bool) {
		if p != nil {
			*n, *has = *p, true
		}
	}
	set(d.PromptTokens, &v.prompt, &v.hasPrompt)
	set(d.TotalTokens, &v.total, &v.hasTotal)
	set(d.CompletionTokens, &v.completion, &v.hasCompletion)
	if d.PromptTokensDetails != nil {
		set(d.PromptTokensDetails.CachedTokens, &v.cached, &v.hasCached)
	}
	return v, true
}

// engineTimings are the engine's own per-request figures (llama.cpp's
// timings, a decision engine's timings).
type engineTimings struct {
	prefillMS  float64
	decodeRate float64
	raw        json.RawMessage
}

// timingValues are the figures of a timings object the router reads.
type timingValues struct {
	promptMS, prefillMS, decodeRate          float64
	hasPromptMS, hasPrefillMS, hasDecodeRate bool
}

func (t *engineTimings) parse(raw json.RawMessage) {
	v, ok := scanTimings(raw)
	if !ok {
		if v, ok = decodeTimings(raw); !ok {
			return
		}
	}
	t.raw = append(t.raw[:0], raw...)
	if v.hasPromptMS && v.promptMS > 0 {
		t.prefillMS = v.promptMS
	}
	if v.hasPrefillMS && v.prefillMS > 0 {
		t.prefillMS = v.prefillMS
	}
	if v.hasDecodeRate && v.decodeRate > 0 {
		t.decodeRate = v.decodeRate
	}
}

// scanTimings reads a timings object (every member a number) without
// decoding it; false when it needs decoding.
func scanTimings(raw []byte) (timingValues, bool) {
	var v timingValues
	if len(raw) > 0 && raw[0] == 'n' {
		return v, string(raw) == "null"
	}
	ok := eachRawMember(raw, func(k, val []byte) bool {
		if val[0] == 'n' {
			// A null figure decodes as 0.
			if string(val) != "null" {
				return false
			}
			val = []byte("0")
		}
		x, ok := jsonFloat(val)
		if !ok {
			return false
		}
		switch string(k) {
		case "prompt_ms":
			v.promptMS, v.hasPromptMS = x, true
		case "prefill_ms":
			v.prefillMS, v.hasPrefillMS = x, true
		case "predicted_per_second":
			v.decodeRate, v.hasDecodeRate = x, true
		}
		return true
	})
	return v, ok
}

// decodeTimings is scanTimings by decoding.
func decodeTimings(raw []byte) (timingValues, bool) {
	var m map[string]float64
	if json.Unmarshal(raw, &m) != nil {
		return timingValues{}, false
	}
	var v timingValues
	v.promptMS, v.hasPromptMS = m["prompt_ms"]
	v.prefillMS, v.hasPrefillMS = m["prefill_ms"]
	v.decodeRate, v.hasDecodeRate = m["predicted_per_second"]
	return v, true
}

// appendMetrics appends capyctl.metrics: each figure with its source
// (router or engine); unknown figures are left out, never written as 0.
func (q *request) appendMetrics(b []byte) []byte {
	end := q.endAt
	if end.IsZero() {
		end = time.Now()
	}
	b = append(b, '{')
	first := true
	fig := func(name string, v float64, source string) {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":{"value":`...)
		b = strconv.AppendFloat(b, math.Round(v*1000)/1000, 'f', -1, 64)
		b = append(b, `,"source":"`...)
		b = append(b, source...)
		b = append(b, `"}`...)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fig("total_ms", ms(end.Sub(q.start)), "router")
	if !q.granted.IsZero() {
		fig("queue_ms", ms(q.granted.Sub(q.start)-q.activation), "router")
	}
	if q.activated {
		fig("activation_ms", ms(q.activation), "router")
	}
	if !q.forwardAt.IsZero() {
		fig("engine_ms", ms(end.Sub(q.forwardAt)), "router")
	}
	if q.api != structs.APIDecisions && !pooling(q.api) && !q.firstContent.IsZero() && !q.forwardAt.IsZero() {
		fig("ttft_ms", ms(q.firstContent.Sub(q.forwardAt)), "router")
	}
	if q.timings.prefillMS > 0 {
		fig("prefill_ms", q.timings.prefillMS, "engine")
	}
	switch {
	case q.timings.decodeRate > 0:
		fig("decode_tokens_per_second", q.timings.decodeRate, "engine")
	case q.usage.completion > 1 && !q.firstContent.IsZero() && q.lastContent.After(q.firstContent):
		fig("decode_tokens_per_second", float64(q.usage.completion-1)/q.lastContent.Sub(q.firstContent).Seconds(), "router")
	}
	if q.usage.known {
		fig("input_tokens", float64(q.usage.prompt), "engine")
		fig("output_tokens", float64(q.usage.completion), "engine")
	}
	if q.usage.cachedOK {
		fig("cached_tokens", float64(q.usage.cached), "engine")
	}
	return append(b, '}')
}

// aggregate builds one chat.completion from a streamed answer, for a
// client that did not ask for a stream.
type aggregate struct {
	created     int64
	fingerprint json.RawMessage
	choices     map[int]*aggChoice
	finished    bool
}

type aggChoice struct {
	role      string
	content   strings.Builder
	hasText   bool
	reasoning strings.Builder
	hasReason bool
	rcontent  strings.Builder
	hasRC     bool
	refusal   strings.Builder
	hasRef    bool
	tools     map[int]*toolCallDelta
	finish    json.RawMessage
}

func newAggregate() *aggregate { return &aggregate{choices: map[int]*aggChoice{}} }

// add folds one chunk in.
func (a *aggregate) add(payload []byte, q *request) {
	if text, ok := plainContent(payload); ok && len(a.choices) > 0 {
		if ac := a.choices[0]; ac != nil {
			ac.content.WriteString(text)
			ac.hasText = true
			if text != "" {
				q.contentN++
				q.contentSeen = true
			}
			return
		}
	}
	var c chunkHead
	if decodeChunk(payload, &c) != nil {
		return
	}
	if c.Created != 0 && a.created == 0 {
		a.created = c.Created
	}
	if len(c.SystemFingerprint) > 0 && string(c.SystemFingerprint) != "null" {
		a.fingerprint = append(a.fingerprint[:0], c.SystemFingerprint...)
	}
	if len(c.Usage) > 0 && string(c.Usage) != "null" {
		q.usage.parse(c.Usage)
	}
	if len(c.Timings) > 0 {
		q.timings.parse(c.Timings)
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		ac := a.choices[ch.Index]
		if ac == nil {
			ac = &aggChoice{role: "assistant"}
			a.choices[ch.Index] = ac
		}
		d := &ch.Delta
		if d.Role != "" {
			ac.role = d.Role
		}
		if ch.hasContent() {
			q.contentN++
			q.contentSeen = true
		}
		if ch.Text != nil {
			ac.content.WriteString(*ch.Text)
			ac.hasText = true
		}
		if d.Content != nil {
			ac.content.WriteString(*d.Content)
			ac.hasText = true
		}
		if d.ReasoningContent != nil {
			ac.rcontent.WriteString(*d.ReasoningContent)
			ac.hasRC = true
		}
		if d.Reasoning != nil {
			ac.reasoning.WriteString(*d.Reasoning)
			ac.hasReason = true
		}
		if d.Refusal != nil {
			ac.refusal.WriteString(*d.Refusal)
			ac.hasRef = true
		}
		for _, tc := range d.ToolCalls {
			if ac.tools == nil {
				ac.tools = map[int]*toolCallDelta{}
			}
			t := ac.tools[tc.Index]
			if t == nil {
				t = &toolCallDelta{Index: tc.Index}
				ac.tools[tc.Index] = t
			}
			if tc.ID != "" {
				t.ID = tc.ID
			}
			if tc.Type != "" {
				t.Type = tc.Type
			}
			t.Function.Name += tc.Function.Name
			t.Function.Arguments += tc.Function.Arguments
		}
		if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
			ac.finish = append(ac.finish[:0], ch.FinishReason...)
			a.finished = true
			q.sawFinish = true
		}
	}
}

// json renders the chat.completion with capyctl.metrics, written by hand
// (no reflection: an assembled answer is on every non-streamed request to
// an engine that must stream).
func (a *aggregate) json(q *request) []byte {
	idx := make([]int, 0, len(a.choices))
	for i := range a.choices {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	created := a.created
	if created == 0 {
		created = q.start.Unix()
	}
	size := 256
	for _, i := range idx {
		ac := a.choices[i]
		size += ac.content.Len() + ac.rcontent.Len() + ac.reasoning.Len() + ac.refusal.Len() + 96
	}
	b := make([]byte, 0, size+len(q.usage.raw)+len(q.timings.raw))
	b = append(b, `{"id":`...)
	b = appendJSONString(b, q.id)
	if q.api == structs.APICompletions {
		b = append(b, `,"object":"text_completion","created":`...)
	} else {
		b = append(b, `,"object":"chat.completion","created":`...)
	}
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, q.model)
	if len(a.fingerprint) > 0 {
		b = append(b, `,"system_fingerprint":`...)
		b = append(b, a.fingerprint...)
	}
	b = append(b, `,"choices":[`...)
	for n, i := range idx {
		if n > 0 {
			b = append(b, ',')
		}
		if q.api == structs.APICompletions {
			b = a.choices[i].appendText(b, i)
		} else {
			b = a.choices[i].appendJSON(b, i)
		}
	}
	b = append(b, ']')
	if q.usage.known && len(q.usage.raw) > 0 {
		b = append(b, `,"usage":`...)
		b = append(b, q.usage.raw...)
	}
	if len(q.timings.raw) > 0 {
		b = append(b, `,"timings":`...)
		b = append(b, q.timings.raw...)
	}
	b = append(b, `,"capyctl":{"metrics":`...)
	b = q.appendMetrics(b)
	return append(b, "}}\n"...)
}

// appendText appends one choice of an assembled text completion.
func (ac *aggChoice) appendText(b []byte, index int) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"text":`...)
	b = appendJSONString(b, ac.content.String())
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	if len(ac.finish) == 0 {
		return append(b, "null}"...)
	}
	b = append(b, ac.finish...)
	return append(b, '}')
}

// appendJSON appends one choice of the assembled answer.
func (ac *aggChoice) appendJSON(b []byte, index int) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"message":{"role":`...)
	b = appendJSONString(b, ac.role)
	b = append(b, `,"content":`...)
	switch {
	case ac.hasText:
		b = appendJSONString(b, ac.content.String())
	case len(ac.tools) > 0:
		b = append(b, "null"...)
	default:
		b = append(b, `""`...)
	}
	for _, f := range []struct {
		name string
		has  bool
		sb   *strings.Builder
	}{{"reasoning_content", ac.hasRC, &ac.rcontent}, {"reasoning", ac.hasReason, &ac.reasoning}, {"refusal", ac.hasRef, &ac.refusal}} {
		if f.has {
			b = append(b, ',')
			b = appendJSONString(b, f.name)
			b = append(b, ':')
			b = appendJSONString(b, f.sb.String())
		}
	}
	if len(ac.tools) > 0 {
		ti := make([]int, 0, len(ac.tools))
		for k := range ac.tools {
			ti = append(ti, k)
		}
		sort.Ints(ti)
		b = append(b, `,"tool_calls":[`...)
		for n, k := range ti {
			t := ac.tools[k]
			if n > 0 {
				b = append(b, ',')
			}
			b = append(b, '{')
			if t.ID != "" {
				b = append(b, `"id":`...)
				b = appendJSONString(b, t.ID)
				b = append(b, ',')
			}
			typ := t.Type
			if typ == "" {
				typ = "function"
			}
			b = append(b, `"type":`...)
			b = appendJSONString(b, typ)
			b = append(b, `,"function":{"name":`...)
			b = appendJSONString(b, t.Function.Name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, t.Function.Arguments)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	b = append(b, `},"finish_reason":`...)
	if len(ac.finish) == 0 {
		return append(b, "null}"...)
	}
	b = append(b, ac.finish...)
	return append(b, '}')
}

// plainContent reads the text of the common chunk whose only choice (index
// 0) has a delta of {"content":"..."} and no finish reason or log
// probabilities, and which carries no usage or timings, without decoding
// it: one walk over its members (scanChunkFacts' walker). ok is false for
// any other shape (decoded in full).
func plainContent(p []byte) (string, bool) {
	var text []byte
	choices := 0
	ok := eachRawMember(p, func(key, v []byte) bool {
		switch string(key) {
		case "usage", "timings":
			return false
		case "choices":
			choices++
			return choices == 1 && eachRawElement(v, func(c []byte) bool {
				if text != nil || len(c) == 0 || c[0] != '{' {
					return false // a second choice, or not an object
				}
				return eachRawMember(c, func(key, v []byte) bool {
					switch string(key) {
					case "index":
						return string(v) == "0"
					case "finish_reason", "logprobs":
						return string(v) == "null"
					case "delta":
						n := 0
						return v[0] == '{' && eachRawMember(v, func(key, v []byte) bool {
							n++
							if n > 1 || string(key) != "content" || v[0] != '"' {
								return false
							}
							text = v
							return true
						})
					}
					return false
				})
			})
		}
		return true
	})
	if !ok || text == nil {
		return "", false
	}
	raw := text[1 : len(text)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), true
	}
	var out string
	if json.Unmarshal(text, &out) != nil {
		return "", false
	}
	return out, true
}
