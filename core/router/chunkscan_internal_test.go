// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
	"testing"
)

// chunkCases are streamed chunks as engines write them, and some they
// should not.
var chunkCases = []struct {
	name string
	in   string
	ok   bool // scanChunkFacts reads it
	want chunkFacts
}{
	{"content", `{"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1}},
	{"role only", `{"id":"c-1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1}},
	{"llama.cpp last chunk", `{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1795971179,"id":"chatcmpl-sQuD","model":"gpt-3.5-turbo","system_fingerprint":"b4748-c392e5094","object":"chat.completion.chunk","usage":{"completion_tokens":6,"prompt_tokens":46,"total_tokens":52},"timings":{"prompt_n":1,"prompt_ms":0.748,"predicted_per_second":3484.3}}`,
		true, chunkFacts{id: []byte("chatcmpl-sQuD"), choices: 1, finish: true, usage: []byte(`{"completion_tokens":6,"prompt_tokens":46,"total_tokens":52}`), timings: []byte(`{"prompt_n":1,"prompt_ms":0.748,"predicted_per_second":3484.3}`)}},
	{"usage only", `{"id":"c-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":null}}`,
		true, chunkFacts{id: []byte("c-1"), usage: []byte(`{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":null}`)}},
	{"usage null", `{"id":"c-1","choices":[{"delta":{"content":"x"}}],"usage":null}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1}},
	{"tool call", `{"id":"c-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","type":"function","function":{"name":"f","arguments":"{\"a\":[1,2]}"}}]}}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1}},
	{"empty tool calls", `{"id":"c-1","choices":[{"index":0,"delta":{"content":null,"tool_calls":[ ]}}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1}},
	{"reasoning", `{"id":"c-1","choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1}},
	{"refusal", `{"id":"c-1","choices":[{"index":0,"delta":{"refusal":"no"}}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1}},
	{"text completion", `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" there","logprobs":null,"finish_reason":"stop"}]}`,
		true, chunkFacts{id: []byte("cmpl-1"), choices: 1, content: 1, finish: true}},
	{"spaces", " { \"id\" : \"c-1\" , \"choices\" : [ { \"delta\" : { \"content\" : \"a\" } , \"finish_reason\" : \"stop\" } ] } ",
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1, finish: true}},
	{"escapes in strings", `{"id":"c-1","choices":[{"delta":{"content":"a\"}]\\"}}]}`,
		true, chunkFacts{id: []byte("c-1"), choices: 1, content: 1}},
	{"escaped id", `{"id":"c\u002d1","choices":[]}`,
		true, chunkFacts{id: []byte(`c\u002d1`), idDecode: true}},
	{"no id", `{"choices":[{"delta":{"content":"a"}}]}`,
		true, chunkFacts{choices: 1, content: 1}},
	{"timings null", `{"id":"c","choices":[],"timings":null}`,
		true, chunkFacts{id: []byte("c"), timings: []byte("null")}},
	{"truncated", `{"id":"c-1","choices":[{"delta":{"content":"a"}}`, false, chunkFacts{}},
	{"trailing bytes", `{"id":"c-1","choices":[]} x`, false, chunkFacts{}},
	{"not an object", `["id"]`, false, chunkFacts{}},
	{"empty", ``, false, chunkFacts{}},
	{"choice null", `{"id":"c","choices":[null]}`, false, chunkFacts{}},
	{"content a number", `{"id":"c","choices":[{"delta":{"content":1}}]}`, false, chunkFacts{}},
	{"id a number", `{"id":1,"choices":[]}`, false, chunkFacts{}},
	{"control character in a string", "{\"id\":\"c\x01\",\"choices\":[]}", false, chunkFacts{}},
	{"missing colon", `{"id" "c"}`, false, chunkFacts{}},
}

func TestScanChunkFacts(t *testing.T) {
	for _, c := range chunkCases {
		t.Run(c.name, func(t *testing.T) {
			var f chunkFacts
			ok := scanChunkFacts([]byte(c.in), &f)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if !sameFacts(&f, &c.want) {
				t.Fatalf("facts = %s, want %s", showFacts(&f), showFacts(&c.want))
			}
		})
	}
}

// TestScanChunkFacts_AgreesWithDecoding holds the scan to what decoding the
// chunk finds, on every chunk both read.
func TestScanChunkFacts_AgreesWithDecoding(t *testing.T) {
	for _, c := range chunkCases {
		t.Run(c.name, func(t *testing.T) { agreeWithDecoding(t, []byte(c.in)) })
	}
}

func FuzzScanChunkFacts(f *testing.F) {
	for _, c := range chunkCases {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		agreeWithDecoding(t, p)
		figuresFound(t, p)
	})
}

func TestCarriesFigures(t *testing.T) {
	cases := []struct {
		name, in string
		want     bool
	}{
		{"content", chunkCases[0].in, false},
		{"llama.cpp's last chunk", chunkCases[2].in, true},
		{"usage only", chunkCases[3].in, true},
		{"usage null", `{"id":"c","choices":[],"usage":null}`, true},
		{"spaces before the colon", `{"id":"c","usage" :{"prompt_tokens":1}}`, true},
		{"timings", `{"id":"c","choices":[{"delta":{"content":"a"}}],"timings":{"prompt_n":1}}`, true},
		{"finish reason", `{"choices":[{"delta":{},"finish_reason":"stop"}]}`, true},
		{"finish reason null", `{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}`, false},
		// As bytes.Contains of "finish_reason":" read them before.
		{"finish reason after a space", `{"choices":[{"delta":{},"finish_reason": "stop"}]}`, false},
		{"a name inside a string", `{"choices":[{"delta":{"content":"\"usage\": 1, \"timings\":2"}}]}`, false},
		{"a value, not a name", `{"choices":[{"delta":{"content":"usage"}}],"x":"timings"}`, false},
		{"a colon at the start", `:`, false},
		{"a quote and a colon", `":`, false},
		{"nothing but a name", `"usage":`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := carriesFigures([]byte(c.in)); got != c.want {
				t.Fatalf("carriesFigures(%s) = %v, want %v", c.in, got, c.want)
			}
		})
	}
}

// figuresFound holds carriesFigures to every chunk whose figures the scan
// reads: a chunk it passes over must carry none.
func figuresFound(t *testing.T, p []byte) {
	t.Helper()
	var f chunkFacts
	if !scanChunkFacts(p, &f) || carriesFigures(p) {
		return
	}
	if f.usage != nil || f.timings != nil || (f.finish && bytes.Contains(p, finishKey)) {
		t.Fatalf("%s: carriesFigures false, but the scan reads %s", p, showFacts(&f))
	}
}

func agreeWithDecoding(t *testing.T, p []byte) {
	t.Helper()
	var lean, dec chunkFacts
	ok := scanChunkFacts(p, &lean)
	if !ok || lean.idDecode || !json.Valid(p) || !exactNames(p) {
		return
	}
	if !decodedFacts(p, &dec) {
		// encoding/json refuses a shape the scan accepts only where a
		// member the scan skips has the wrong type for chunkHead.
		return
	}
	// decodedFacts copies usage and timings as written; the scan's are
	// sub-slices of p: both as written.
	if !sameFacts(&lean, &dec) {
		t.Fatalf("%s: scan %s, decoding %s", p, showFacts(&lean), showFacts(&dec))
	}
}

// scannedNames are the member names scanChunkFacts reads.
var scannedNames = []string{"id", "choices", "delta", "content", "reasoning_content", "reasoning", "refusal", "tool_calls", "text", "finish_reason", "usage", "timings"}

// exactNames reports a chunk whose members the scan and encoding/json
// match alike: encoding/json also matches a name written in another case
// (ID) or with escapes (\u0069d), which the scan, by design, does not (the
// router reads members by their exact names, as engines and clients do).
func exactNames(p []byte) bool {
	if bytes.Contains(p, []byte(`\u`)) {
		return false
	}
	lower := bytes.ToLower(p)
	for _, n := range scannedNames {
		q := []byte(`"` + n + `"`)
		if bytes.Count(lower, q) != bytes.Count(p, q) {
			return false
		}
	}
	return true
}

func sameFacts(a, b *chunkFacts) bool {
	return bytes.Equal(a.id, b.id) && a.idDecode == b.idDecode && a.choices == b.choices && a.content == b.content &&
		a.finish == b.finish && bytes.Equal(a.usage, b.usage) && bytes.Equal(a.timings, b.timings)
}

func showFacts(f *chunkFacts) string {
	b, _ := json.Marshal(map[string]any{"id": string(f.id), "escape": f.idDecode, "choices": f.choices, "content": f.content,
		"finish": f.finish, "usage": string(f.usage), "timings": string(f.timings)})
	return string(b)
}

func TestScanUsage_AgreesWithDecoding(t *testing.T) {
	cases := []struct {
		in string
		ok bool
	}{
		{`{"prompt_tokens":46,"completion_tokens":6,"total_tokens":52}`, true},
		{`{"prompt_tokens":5,"total_tokens":10,"completion_tokens":5,"prompt_tokens_details":null}`, true},
		{`{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0}}`, true},
		{`{"total_tokens":7}`, true},
		{`{"prompt_tokens":null,"completion_tokens":2}`, true},
		{`{"prompt_tokens":1,"prompt_tokens":2}`, true},
		{`{"prompt_tokens":1.5}`, false},
		{`{"prompt_tokens":"3"}`, false},
		{`{"prompt_tokens_details":{"cached_tokens":"x"}}`, false},
		{`[1]`, false},
	}
	for _, c := range cases {
		v, ok := scanUsage([]byte(c.in))
		if ok != c.ok {
			t.Fatalf("scanUsage(%s) ok = %v, want %v", c.in, ok, c.ok)
		}
		if !ok {
			continue
		}
		d, dok := decodeUsage([]byte(c.in))
		if !dok || v != d {
			t.Fatalf("scanUsage(%s) = %+v, decoding %+v (%v)", c.in, v, d, dok)
		}
	}
}

func TestScanTimings_AgreesWithDecoding(t *testing.T) {
	cases := []struct {
		in string
		ok bool
	}{
		{`{"prompt_n":46,"prompt_ms":3.774,"prompt_per_token_ms":0.082,"predicted_n":32,"predicted_ms":9.644,"predicted_per_second":3318.13}`, true},
		{`{"prefill_ms":12,"decode_ms":4e2}`, true},
		{`{"prompt_ms":null}`, true},
		{`null`, true},
		{`{}`, true},
		{`{"prompt_ms":"3"}`, false},
		{`{"prompt_ms":0x10}`, false},
		{`{"prompt_ms":{"a":1}}`, false},
	}
	for _, c := range cases {
		v, ok := scanTimings([]byte(c.in))
		if ok != c.ok {
			t.Fatalf("scanTimings(%s) ok = %v, want %v", c.in, ok, c.ok)
		}
		if !ok {
			continue
		}
		d, dok := decodeTimings([]byte(c.in))
		if !dok || v != d {
			t.Fatalf("scanTimings(%s) = %+v, decoding %+v (%v)", c.in, v, d, dok)
		}
	}
}

// TestScanChunkFacts_NoAllocation keeps the scan free of allocations: it
// runs on a taken-over stream's goroutine for every chunk that carries a
// finish reason or usage.
func TestScanChunkFacts_NoAllocation(t *testing.T) {
	p := []byte(chunkCases[2].in)
	var f chunkFacts
	if n := testing.AllocsPerRun(100, func() { scanChunkFacts(p, &f) }); n != 0 {
		t.Fatalf("scanChunkFacts allocates %v times a chunk", n)
	}
}

// carriesFigures is scanMembers's verdict alone, of a rewriter with no
// replacements: the tests' reference for what a chunk carries.
func carriesFigures(p []byte) bool {
	var rw rewriter
	return rw.scanMembers(p)
}
