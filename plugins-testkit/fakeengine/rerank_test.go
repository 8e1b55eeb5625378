// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestEngine_Rerank: the flavours whose engine serves POST /v1/rerank (and
// llama-server's /rerank) answer in its shape (vLLM's with an id, each result's document
// and usage with total_tokens only; llama-server's without an id, with
// object "list" and prompt_tokens), each document's deterministic score,
// best first, top_n of them when asked; llama-server only when started
// with --reranking (else 501, as the real one); the others have no such
// route.
func TestEngine_Rerank(t *testing.T) {
	cases := []struct {
		name    string
		flavour fakeengine.Flavour
		header  map[string]string
		status  int    // for a valid request
		wantID  string // the answer's id ("" none)
		vllm    bool   // vLLM's shape
		short   bool   // serves /rerank too (llama-server)
	}{
		{name: "openai", flavour: fakeengine.OpenAI{}, header: map[string]string{"X-Request-Id": "r1"}, status: 200, wantID: "rerank-r1", vllm: true},
		{name: "vllm", flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{}), header: map[string]string{"X-Request-Id": "r1"}, status: 200, wantID: "rerank-r1", vllm: true},
		{name: "llamacpp --reranking", flavour: fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{Reranking: true}), status: 200, short: true},
		{name: "llamacpp without --reranking", flavour: fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{}), status: 501},
		{name: "sglang", flavour: fakeengine.NewSGLang(fakeengine.SGLangOptions{}), status: 404},
		{name: "tensorfold", flavour: fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{}), status: 404},
	}
	type answer struct {
		ID      *string `json:"id"`
		Object  *string `json:"object"`
		Model   string  `json:"model"`
		Results []struct {
			Index    int `json:"index"`
			Document *struct {
				Text string `json:"text"`
			} `json:"document"`
			RelevanceScore float64 `json:"relevance_score"`
		} `json:"results"`
		Usage struct {
			PromptTokens *int `json:"prompt_tokens"`
			TotalTokens  int  `json:"total_tokens"`
		} `json:"usage"`
	}
	docs := []string{"one two", "three", "four five six"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			te := startEngine(t, fakeengine.Config{Flavour: c.flavour}, true)
			hdr := map[string]string{"Content-Type": "application/json"}
			for k, v := range c.header {
				hdr[k] = v
			}
			status, data, _ := do(t, http.MethodPost, te.url+"/v1/rerank", `{"model":"m","query":"q","documents":["one two","three","four five six"]}`, hdr)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, data)
			}
			if status != 200 {
				return
			}
			var out answer
			if err := json.Unmarshal(data, &out); err != nil {
				t.Fatal(err)
			}
			// Tokens: each document with the query, plus one (4 + 3 + 5).
			if out.Model != "m" || len(out.Results) != 3 || out.Usage.TotalTokens != 12 {
				t.Fatalf("answer: %s", data)
			}
			switch {
			case c.wantID == "" && out.ID != nil, c.wantID != "" && (out.ID == nil || *out.ID != c.wantID):
				t.Fatalf("id: %s", data)
			case c.vllm && (out.Object != nil || out.Usage.PromptTokens != nil):
				t.Fatalf("vLLM's answer has no object nor prompt_tokens: %s", data)
			case !c.vllm && (out.Object == nil || *out.Object != "list" || out.Usage.PromptTokens == nil || *out.Usage.PromptTokens != 12):
				t.Fatalf("llama-server's answer has object list and prompt_tokens: %s", data)
			}
			want := []float64{fakeengine.RerankScore("m", "q", docs[0]), fakeengine.RerankScore("m", "q", docs[1]), fakeengine.RerankScore("m", "q", docs[2])}
			seen := map[int]bool{}
			for i, r := range out.Results {
				if r.Index < 0 || r.Index > 2 || seen[r.Index] || r.RelevanceScore != want[r.Index] ||
					(i > 0 && r.RelevanceScore > out.Results[i-1].RelevanceScore) {
					t.Fatalf("results[%d] = %+v, want the scores %v best first: %s", i, r, want, data)
				}
				seen[r.Index] = true
				if c.vllm != (r.Document != nil) || (r.Document != nil && r.Document.Text != docs[r.Index]) {
					t.Fatalf("results[%d] document: %s", i, data)
				}
			}
			// top_n keeps the best; the same scores again.
			path := "/v1/rerank"
			if c.short {
				path = "/rerank"
			}
			status, data, _ = do(t, http.MethodPost, te.url+path, `{"model":"m","query":"q","documents":["one two","three","four five six"],"top_n":1}`, hdr)
			var top answer
			sort.Float64s(want)
			if status != 200 || json.Unmarshal(data, &top) != nil || len(top.Results) != 1 || top.Results[0].RelevanceScore != want[2] {
				t.Fatalf("top_n 1 on %s: %d %s", path, status, data)
			}
			// A query and documents are required (llama-server b4748
			// answers every client error 500).
			for _, b := range []string{`{"model":"m","documents":["a"]}`, `{"model":"m","query":"q"}`, `{"model":"m","query":"q","documents":[]}`} {
				status, data, _ = do(t, http.MethodPost, te.url+"/v1/rerank", b, hdr)
				if (status != 400 && !(status == 500 && strings.HasPrefix(c.name, "llamacpp"))) ||
					!(strings.Contains(string(data), "query") || strings.Contains(string(data), "documents")) {
					t.Fatalf("%s: %d %s", b, status, data)
				}
			}
			if st := te.Stats(); st.Total != 2 || st.Completed != 2 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
