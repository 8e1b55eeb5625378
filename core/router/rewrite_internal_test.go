// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestRewriter_Write(t *testing.T) {
	cases := []struct {
		name, in, oldID, served, want string
	}{
		{"id and model", `{"id":"e-1","object":"chat.completion.chunk","model":"m","choices":[]}`, "e-1", "m",
			`{"id":"capy-1","object":"chat.completion.chunk","model":"demo","choices":[]}`},
		{"spaces after the colons", `{"id": "e-1", "model": "m"}`, "e-1", "m", `{"id": "capy-1", "model": "demo"}`},
		{"llama.cpp's order", `{"choices":[{"delta":{"content":"m"}}],"created":1,"id":"e-1","model":"m","object":"x"}`, "e-1", "m",
			`{"choices":[{"delta":{"content":"m"}}],"created":1,"id":"capy-1","model":"demo","object":"x"}`},
		{"the old id as another member's value", `{"id":"e-1","ref":"e-1","xid":"e-1"}`, "e-1", "",
			`{"id":"capy-1","ref":"e-1","xid":"e-1"}`},
		{"a nested id", `{"id":"e-1","x":{"id":"e-1"}}`, "e-1", "", `{"id":"capy-1","x":{"id":"capy-1"}}`},
		{"inside a string", `{"content":"\"id\":\"e-1\"","id":"e-1"}`, "e-1", "", `{"content":"\"id\":\"e-1\"","id":"capy-1"}`},
		{"a longer id with the same start", `{"id":"e-10"}`, "e-1", "", `{"id":"e-10"}`},
		{"two spaces", `{"id":  "e-1"}`, "e-1", "", `{"id":  "e-1"}`},
		{"model only", `{"model":"m","id":"x"}`, "", "m", `{"model":"demo","id":"x"}`},
		{"nothing to replace", `{"id":"e-1","model":"demo"}`, "", "", `{"id":"e-1","model":"demo"}`},
		{"an id with quotes", `{"id":"a\"b"}`, `a"b`, "", `{"id":"capy-1"}`},
		// Longer than the tail the search looks for.
		{"a long id", `{"id":"chatcmpl-8f2b0c7e9d0a4c1b9b5a","model":"m"}`, "chatcmpl-8f2b0c7e9d0a4c1b9b5a", "m", `{"id":"capy-1","model":"demo"}`},
		{"a long id at the end", `{"choices":[],"model":"m","id":"chatcmpl-8f2b0c7e9d0a4c1b9b5a"}`, "chatcmpl-8f2b0c7e9d0a4c1b9b5a", "",
			`{"choices":[],"model":"m","id":"capy-1"}`},
		{"another value ending like the id", `{"ref":"xx-8f2b0c7e9d0a4c1b9b5a","id":"x-8f2b0c7e9d0a4c1b9b5a","id":"chatcmpl-8f2b0c7e9d0a4c1b9b5a"}`, "chatcmpl-8f2b0c7e9d0a4c1b9b5a", "",
			`{"ref":"xx-8f2b0c7e9d0a4c1b9b5a","id":"x-8f2b0c7e9d0a4c1b9b5a","id":"capy-1"}`},
		{"a long id twice", `{"id":"chatcmpl-8f2b0c7e9d0a4c1b9b5a","x":{"id": "chatcmpl-8f2b0c7e9d0a4c1b9b5a"}}`, "chatcmpl-8f2b0c7e9d0a4c1b9b5a", "",
			`{"id":"capy-1","x":{"id": "capy-1"}}`},
		{"a long served name", `{"model":"org/some-model-name-v2","id":"x"}`, "", "org/some-model-name-v2", `{"model":"demo","id":"x"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rw := rewriter{newID: "capy-1", public: "demo", served: c.served}
			if c.served == "" {
				rw.served = "demo"
			}
			if c.oldID != "" {
				rw.setOldID(c.oldID)
			}
			q := &request{cw: cwPending}
			defer q.out.release()
			if err := rw.write(q, []byte(c.in)); err != nil {
				t.Fatal(err)
			}
			if got := string(q.out.data()); got != c.want {
				t.Fatalf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestRewriter_WalkedSitesAreTheSearchedOnes: where scanMembers walked a
// chunk (no figures in it), write replaces exactly what its search would:
// the cases above and chunks built at random from members, values and
// strings that look like them.
func TestRewriter_WalkedSitesAreTheSearchedOnes(t *testing.T) {
	const oldID = "chatcmpl-8f2b0c7e9d0a4c1b9b5a"
	pieces := []string{`{`, `}`, `,`, `[`, `]`, `"id":`, `"id": `, `"id" :`, `"id":  `, `"xid":`, `"model":`, `"model": `,
		`"` + oldID + `"`, `"chatcmpl-x` + oldID + `"`, `"e-1"`, `"m"`, `"m2"`, `"demo"`, `"content":`, `"a:b"`,
		`"\"id\":\"` + oldID + `\""`, `"object":"chat.completion.chunk"`, `1`, ` `, `:`, `"`, `\"`, `"e-1`,
		`"usage":`, `"finish_reason":"stop"`, `"timings":`}
	rng := rand.New(rand.NewPCG(1, 2))
	var chunks []string
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := rng.IntN(12); n >= 0; n-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		chunks = append(chunks, b.String())
	}
	// More replacement sites than a walk records, then the figures.
	many := `{"id":"` + oldID + `","model":"m","a":{"id":"` + oldID + `","model":"m"},"b":{"id":"` + oldID + `"},"usage":{"total_tokens":3}}`
	chunks = append(chunks, many, many[:len(many)-len(`"usage":{"total_tokens":3}}`)]+`"x":1}`)
	for _, c := range []struct{ oldID, served string }{{oldID, "m"}, {"e-1", "m"}, {oldID, ""}, {"", "m"}} {
		for _, in := range chunks {
			// The walk's verdict on figures is the one without
			// replacements, whatever the chunk's replacement sites.
			rw := rewriter{newID: "capy-1", public: "demo", served: c.served}
			if c.oldID != "" {
				rw.setOldID(c.oldID)
			}
			if got, want := rw.scanMembers([]byte(in)), carriesFigures([]byte(in)); got != want {
				t.Fatalf("old id %q, served %q, chunk %s: figures %v, want %v", c.oldID, c.served, in, got, want)
			}
			write := func(walk bool) (string, bool) {
				rw := rewriter{newID: "capy-1", public: "demo", served: c.served}
				if c.served == "" {
					rw.served = "demo"
				}
				if c.oldID != "" {
					rw.setOldID(c.oldID)
				}
				walked := false
				if walk {
					walked = !rw.scanMembers([]byte(in)) && rw.walked
				}
				q := &request{cw: cwPending}
				defer q.out.release()
				if err := rw.write(q, []byte(in)); err != nil {
					t.Fatal(err)
				}
				return string(q.out.data()), walked
			}
			searched, _ := write(false)
			walkedOut, walked := write(true)
			if walked && walkedOut != searched {
				t.Fatalf("old id %q, served %q, chunk %s:\nwalked   %s\nsearched %s", c.oldID, c.served, in, walkedOut, searched)
			}
		}
	}
}

// TestRewriter_TemplateReadsAsTheWalk: one rewriter through an answer's
// chunks, which keeps the last one as a template (fitsTemplate), finds
// the same figures and writes the same bytes as a walk and a search over
// each chunk alone: chunks of a few engines' shapes around random content
// bodies, quotes and escapes, members and figures within them included.
func TestRewriter_TemplateReadsAsTheWalk(t *testing.T) {
	const oldID = "chatcmpl-8f2b0c7e9d0a4c1b9b5a"
	shapes := []string{
		`{"id":"` + oldID + `","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"BODY"},"finish_reason":null}]}`,
		`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"BODY"}}],"created":1,"id":"` + oldID + `","model":"m","object":"chat.completion.chunk"}`,
		`{"id": "` + oldID + `", "model": "m", "choices": [{"delta": {"content": "BODY"}}]}`,
		`{"id":"` + oldID + `","choices":[{"delta":{"content":"BODY"}}],"usage":{"prompt_tokens":1}}`,
		`{"id":"` + oldID + `","choices":[{"delta":{"content":"BODY"},"finish_reason":"stop"}]}`,
		`{"id":"` + oldID + `","choices":[{"delta":{"content":"BODY","x":{"id":"` + oldID + `"}}}]}`,
		`{"id":"other","model":"m","choices":[{"delta":{"content":"BODY"}}]}`,
	}
	bodies := []string{`a`, ` `, `\"`, `\\`, `"`, `:`, `"id":"` + oldID + `"`, `\"id\":\"` + oldID + `\"`, `\\"`,
		`","usage":{"a":1},"b":"`, `"},"finish_reason":"stop","x":"`, `\u0022`, `m`, `"model":"m"`, `\\\"`}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct{ oldID, served string }{{oldID, "m"}, {oldID, ""}, {"", "m"}} {
		seq := rewriter{newID: "capy-1", public: "demo", served: c.served}
		if c.served == "" {
			seq.served = "demo"
		}
		if c.oldID != "" {
			seq.setOldID(c.oldID)
		}
		if c.oldID != "" {
			// The fake engine's chunks: the second fits the first.
			first := []byte(strings.Replace(shapes[0], "BODY", "hello", 1))
			if seq.scanMembers(first) || !seq.fitsTemplate([]byte(strings.Replace(shapes[0], "BODY", " world: ok", 1))) {
				t.Fatalf("a chunk of the same shape does not fit the template %q", seq.tpl)
			}
		}
		shape := shapes[0]
		for i := 0; i < 30000; i++ {
			if rng.IntN(8) == 0 {
				shape = shapes[rng.IntN(len(shapes))]
			}
			var b strings.Builder
			for n := rng.IntN(4); n >= 0; n-- {
				b.WriteString(bodies[rng.IntN(len(bodies))])
			}
			in := []byte(strings.Replace(shape, "BODY", b.String(), 1))
			alone := seq
			alone.tpl, alone.tplPre, alone.tplSites = nil, 0, nil
			wantFigures := alone.scanMembers(in)
			q := &request{cw: cwPending}
			if err := alone.write(q, in); err != nil {
				t.Fatal(err)
			}
			want := string(q.out.data())
			q.out.release()
			if got := seq.scanMembers(in); got != wantFigures {
				t.Fatalf("chunk %d %s: figures %v, alone %v", i, in, got, wantFigures)
			}
			if err := seq.write(q, in); err != nil {
				t.Fatal(err)
			}
			if got := string(q.out.data()); got != want {
				t.Fatalf("chunk %d %s:\nwith the template %s\nalone             %s", i, in, got, want)
			}
			q.out.release()
		}
	}
}
