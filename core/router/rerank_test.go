// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// rerankAnswer is a rerank answer as the tests read it.
type rerankAnswer struct {
	ID      *string `json:"id"`
	Model   string  `json:"model"`
	Results []struct {
		Index    int `json:"index"`
		Document *struct {
			Text string `json:"text"`
		} `json:"document"`
		RelevanceScore float64 `json:"relevance_score"`
	} `json:"results"`
	Usage *struct {
		PromptTokens *int `json:"prompt_tokens"`
		TotalTokens  int  `json:"total_tokens"`
	} `json:"usage"`
	CapyCTL *struct {
		Metrics map[string]struct {
			Value  float64 `json:"value"`
			Source string  `json:"source"`
		} `json:"metrics"`
	} `json:"capyctl"`
}

// TestRouter_Rerank routes POST /v1/rerank to a rerank deployment, on an
// engine whose answer has an id (vLLM's shape: it becomes the request ID;
// usage has total_tokens only) and on one whose answer has none
// (llama-server's: none is added), with and without top_n: the documents'
// scores best first under the public model name, with usage,
// capyctl.metrics and the request ID header.
func TestRouter_Rerank(t *testing.T) {
	llama := func() fakeengine.Flavour { return fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{Reranking: true}) }
	cases := []struct {
		name    string
		flavour fakeengine.Flavour
		extra   string
		n       int
		engID   bool
	}{
		{name: "answer with an id", n: 3, engID: true},
		{name: "answer with an id, top_n", extra: `,"top_n":2`, n: 2, engID: true},
		{name: "answer without an id", flavour: llama(), n: 3},
		{name: "answer without an id, top_n", flavour: llama(), extra: `,"top_n":1`, n: 1},
	}
	docs := []string{"a panda is a bear", "hi", "the giant panda lives in China"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{api: structs.APIRerank, engine: fakeengine.Config{Flavour: c.flavour}})
			var out rerankAnswer
			body, rid := postForJSON(t, e, "/v1/rerank",
				`{"model":"demo","query":"what is a panda?","documents":["`+strings.Join(docs, `","`)+`"]`+c.extra+`}`, &out)
			if out.Model != "demo" || len(out.Results) != c.n {
				t.Fatalf("answer: %s", body)
			}
			switch {
			case c.engID && (out.ID == nil || *out.ID != rid):
				t.Fatalf("id %v, want the request ID %s: %s", out.ID, rid, body)
			case !c.engID && out.ID != nil:
				t.Fatalf("an id was added to an answer without one: %s", body)
			}
			for i, r := range out.Results {
				if i > 0 && r.RelevanceScore > out.Results[i-1].RelevanceScore {
					t.Fatalf("results not best first: %s", body)
				}
				if r.Index < 0 || r.Index >= len(docs) {
					t.Fatalf("results[%d]: %s", i, body)
				}
				if c.engID && (r.Document == nil || r.Document.Text != docs[r.Index]) {
					t.Fatalf("results[%d] document: %s", i, body)
				}
			}
			if out.Usage == nil || out.Usage.TotalTokens == 0 || (c.engID != (out.Usage.PromptTokens == nil)) {
				t.Fatalf("usage: %s", body)
			}
			// vLLM counts only total_tokens: it is the input.
			if out.CapyCTL == nil || out.CapyCTL.Metrics["input_tokens"].Value != float64(out.Usage.TotalTokens) ||
				out.CapyCTL.Metrics["input_tokens"].Source != "engine" || out.CapyCTL.Metrics["total_ms"].Source != "router" {
				t.Fatalf("metrics: %s", body)
			}
			if _, ok := out.CapyCTL.Metrics["ttft_ms"]; ok {
				t.Fatalf("a rerank answer has no first token: %s", body)
			}
			if st := e.eng.Stats(); st.Total != 1 || st.Completed != 1 {
				t.Fatalf("engine stats: %+v", st)
			}
			waitFor(t, "idle", e.idle)
		})
	}
}

// TestRouter_RerankHangUpCancelsOnTheEngine: a client that goes away ends
// the rerank request on the engine by closing its connection; no abort by
// request ID is asked for (the engine never had it).
func TestRouter_RerankHangUpCancelsOnTheEngine(t *testing.T) {
	checkHangUpClosesOnTheEngine(t, structs.APIRerank, "/v1/rerank", `{"model":"demo","query":"q","documents":["a","b"]}`)
}

// TestRouter_RerankAPIMismatch: rerank for a chat, embeddings or decision
// model, and chat, a text completion or embeddings for a rerank model,
// are refused with api_mismatch naming the model's endpoint, before
// anything wakes.
func TestRouter_RerankAPIMismatch(t *testing.T) {
	rerank := `{"model":"demo","query":"q","documents":["a"]}`
	checkAPIMismatch(t, []apiMismatchCase{
		{name: "rerank to a chat model", api: structs.APIChat, path: "/v1/rerank", body: rerank, wantEndpoint: "/v1/chat/completions"},
		{name: "rerank to an embeddings model", api: structs.APIEmbeddings, path: "/v1/rerank", body: rerank, wantEndpoint: "/v1/embeddings"},
		{name: "rerank to a decision model", api: structs.APIDecisions, path: "/v1/rerank", body: rerank, wantEndpoint: "/v1/systemone"},
		{name: "chat to a rerank model", api: structs.APIRerank, path: "/v1/chat/completions", body: chatBody(false, ""), wantEndpoint: "/v1/rerank"},
		{name: "completions to a rerank model", api: structs.APIRerank, path: "/v1/completions", body: completionsBody(false, ""), wantEndpoint: "/v1/rerank"},
		{name: "embeddings to a rerank model", api: structs.APIRerank, path: "/v1/embeddings", body: `{"model":"demo","input":"x"}`, wantEndpoint: "/v1/rerank"},
	})
}

// TestRouter_RerankNeedsQueryAndDocuments: a body without a query or
// without documents is refused before anything wakes.
func TestRouter_RerankNeedsQueryAndDocuments(t *testing.T) {
	checkInvalidBeforeWake(t, structs.APIRerank, "/v1/rerank",
		`{"model":"demo"}`,
		`{"model":"demo","documents":["a"]}`,
		`{"model":"demo","query":null,"documents":["a"]}`,
		`{"model":"demo","query":"q"}`,
		`{"model":"demo","query":"q","documents":null}`,
	)
}
