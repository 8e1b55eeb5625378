// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"sort"
	"strings"
)

// The rerank API (POST /v1/rerank), as vLLM (cross-encoder models) and
// llama-server (--reranking) serve it: Jina's and Cohere's shape,
//
//	{"model":…,"query":"…","documents":["…",…],"top_n":n}
//
// answered, never streamed, with the documents' scores, best first:
//
//	vLLM:         {"id":"rerank-…","model":…,"usage":{"total_tokens":n},
//	               "results":[{"index":i,"document":{"text":"…"},"relevance_score":s}]}
//	llama-server: {"model":…,"object":"list","usage":{"prompt_tokens":n,"total_tokens":n},
//	               "results":[{"index":i,"relevance_score":s}]}

// RerankHandler serves POST /v1/rerank: it checks the request ("query" is
// a string, "documents" a non-empty list of strings; the flavour's
// PrepareChat checks the model and takes the request ID), then answers
// each document's deterministic score (RerankScore), best first, the
// first top_n of them when top_n is given. vllm gives the answer vLLM's
// shape (an id, each result's document, usage with total_tokens only);
// else llama-server's. Each document is one piece of work, so
// StallAfterTokens and TokenRate apply to it; a client that goes away
// stops it at once.
func (e *Engine) RerankHandler(vllm bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := e.flavour
		body, ok := e.readBody(w, r)
		if !ok {
			return
		}
		req, rr, err := DecodeRerank(body)
		if !e.prepare(w, r, req, err) {
			return
		}
		prompt := 0
		for _, d := range rr.Documents {
			prompt += len(strings.Fields(rr.Query)) + len(strings.Fields(d)) + 1
		}
		g, end := e.begin(w, r, req, prompt, false)
		defer end()
		if g == nil {
			return
		}
		if ok, at := g.run(rr.Documents, func(string) bool { return true }); !ok {
			g.cancelled(at)
			if g.aborted() {
				f.WriteError(w, KindEngineFailure, "request aborted")
			}
			return
		}
		g.release()
		e.completed.Add(1)
		e.Activity()
		results := make([]RerankResult, len(rr.Documents))
		for i, d := range rr.Documents {
			results[i] = RerankResult{Index: i, RelevanceScore: RerankScore(e.cfg.ServedName, rr.Query, d)}
			if vllm {
				results[i].Document = &RerankDocument{Text: d}
			}
		}
		sort.SliceStable(results, func(a, b int) bool { return results[a].RelevanceScore > results[b].RelevanceScore })
		if rr.TopN > 0 && rr.TopN < len(results) {
			results = results[:rr.TopN]
		}
		resp := &RerankResponse{Model: req.ResponseModel, Usage: RerankUsage{TotalTokens: prompt}, Results: results}
		if vllm {
			resp.ID = "rerank-" + req.ID
		} else {
			resp.Object = "list"
			resp.Usage.PromptTokens = &prompt
		}
		WriteJSON(w, http.StatusOK, resp)
	})
}

// RerankRequest is a rerank body's query, documents and top_n.
type RerankRequest struct {
	Query     string   `json:"query"`
	Documents []string `json:"documents"`
	// TopN bounds the results (0: all).
	TopN int `json:"top_n"`
}

// DecodeRerank parses and checks a rerank body: the request (its model
// and raw members, for the flavour's PrepareChat) and its query and
// documents. Errors are *APIError.
func DecodeRerank(body []byte) (*ChatRequest, *RerankRequest, error) {
	if !json.Valid(body) {
		return nil, nil, &APIError{Kind: KindInvalidJSON, Message: "request body is not valid JSON"}
	}
	var in struct {
		Model     string          `json:"model"`
		Query     json.RawMessage `json:"query"`
		Documents json.RawMessage `json:"documents"`
		TopN      *int            `json:"top_n"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, nil, &APIError{Kind: KindInvalidRequest, Message: fmt.Sprintf("invalid request: %v", err)}
	}
	req := &ChatRequest{Model: in.Model}
	if err := json.Unmarshal(body, &req.Raw); err != nil {
		return nil, nil, &APIError{Kind: KindInvalidRequest, Message: "request body must be a JSON object"}
	}
	rr := &RerankRequest{}
	if len(in.Query) == 0 || in.Query[0] != '"' || json.Unmarshal(in.Query, &rr.Query) != nil {
		return nil, nil, &APIError{Kind: KindInvalidRequest, Message: "query must be a string"}
	}
	if json.Unmarshal(in.Documents, &rr.Documents) != nil || len(rr.Documents) == 0 {
		return nil, nil, &APIError{Kind: KindInvalidRequest, Message: "documents must be a non-empty list of strings"}
	}
	if in.TopN != nil {
		if *in.TopN < 0 {
			return nil, nil, &APIError{Kind: KindInvalidRequest, Message: "top_n must not be negative"}
		}
		rr.TopN = *in.TopN
	}
	return req, rr, nil
}

// RerankScore is the fake's relevance score of a document for a query: a
// number in [0, 1) from a hash of the model, the query and the document,
// rounded to 6 decimals.
func RerankScore(model, query, document string) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s", model, query, document)
	x := float64(splitmix64(h.Sum64())%1000000) / 1000000
	return math.Round(x*1e6) / 1e6
}

// RerankResponse is a rerank answer.
type RerankResponse struct {
	// ID is "rerank-…" (vLLM); absent otherwise.
	ID string `json:"id,omitempty"`
	// Object is "list" (llama-server); absent otherwise.
	Object string `json:"object,omitempty"`
	// Model is the answering model's name.
	Model string `json:"model"`
	// Usage counts the request's tokens.
	Usage RerankUsage `json:"usage"`
	// Results holds the documents' scores, best first.
	Results []RerankResult `json:"results"`
}

// RerankUsage counts a rerank request's tokens.
type RerankUsage struct {
	// PromptTokens is TotalTokens (llama-server); absent otherwise.
	PromptTokens *int `json:"prompt_tokens,omitempty"`
	// TotalTokens counts the query and documents.
	TotalTokens int `json:"total_tokens"`
}

// RerankResult is one document's score.
type RerankResult struct {
	// Index is the document's position in the request.
	Index int `json:"index"`
	// Document is the document (vLLM); absent otherwise.
	Document *RerankDocument `json:"document,omitempty"`
	// RelevanceScore is the document's score.
	RelevanceScore float64 `json:"relevance_score"`
}

// RerankDocument is a result's document.
type RerankDocument struct {
	// Text is the document.
	Text string `json:"text"`
}
