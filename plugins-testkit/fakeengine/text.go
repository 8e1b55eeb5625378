// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
)

// vocabulary is what answers are made of.
var vocabulary = []string{
	"the", "a", "capybara", "river", "sits", "quietly", "near", "warm",
	"water", "and", "watches", "birds", "over", "green", "grass", "while",
	"sun", "sets", "slowly", "behind", "tall", "reeds", "every", "evening",
	"friends", "gather", "to", "rest", "in", "calm", "shade", "of",
	"old", "trees", "softly", "breathing", "cool", "air", "after", "long",
	"days", "wandering", "through", "muddy", "banks", "with", "gentle", "steps",
	"models", "answer", "questions", "about", "memory", "engines", "tokens", "flow",
	"one", "by", "small", "bright", "ideas", "grow", "here", "today",
}

// answerTokens is the deterministic answer to a prompt: n words drawn from
// the vocabulary by a hash of the served name, the last user message and
// the seed. The first token has no leading space, the others one.
func answerTokens(served, lastUser string, seed uint64, n int) []string {
	h := fnv.New64a()
	h.Write([]byte(served))
	h.Write([]byte{0})
	h.Write([]byte(lastUser))
	h.Write([]byte{0})
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	base := h.Sum64()
	toks := make([]string, n)
	for i := range toks {
		w := vocabulary[splitmix64(base+uint64(i)*0x9e3779b97f4a7c15)%uint64(len(vocabulary))]
		if i > 0 {
			w = " " + w
		}
		toks[i] = w
	}
	return toks
}

// splitmix64 scrambles x (the SplitMix64 finaliser).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// bigChunk is n bytes of printable filler.
func bigChunk(n int) string {
	const pattern = "capybara-big-chunk-0123456789-"
	var sb strings.Builder
	sb.Grow(n)
	for sb.Len() < n {
		sb.WriteString(pattern[:min(len(pattern), n-sb.Len())])
	}
	return sb.String()
}

// promptTokenList is the prompt as countPromptTokens counts it: each
// message's template marker tokens, then its words.
func promptTokenList(msgs []Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, "<|im_start|>", m.Role, "\n", "<|sep|>")
		out = append(out, strings.Fields(m.Text())...)
	}
	return out
}

// countPromptTokens approximates a tokenizer: the words of every message
// plus 4 per message for the chat template.
func countPromptTokens(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		n += len(strings.Fields(m.Text())) + 4
	}
	return n
}
