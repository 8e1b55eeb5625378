// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strings"
	"time"
)

// The embeddings API (POST /v1/embeddings), as vLLM (pooling models),
// SGLang (--is-embedding) and llama-server (--embeddings) serve it:
// OpenAI's shape,
//
//	{"object":"list","data":[{"object":"embedding","index":0,"embedding":[…]}],
//	 "model":…,"usage":{"prompt_tokens":n,"total_tokens":n}}
//
// never streamed. vLLM adds "id":"embd-…" and "created"; SGLang and
// llama-server answer without an id.

// EmbeddingDims is the length of the fake's vectors.
const EmbeddingDims = 8

// EmbeddingsHandler serves POST /v1/embeddings: it checks the request
// ("input" is a string or a non-empty list of strings; the flavour's
// PrepareChat checks the model and takes the request ID), then answers one
// deterministic vector per input. withID gives the answer an "id" and
// "created" (vLLM's shape). Each input is one piece of work, so
// StallAfterTokens and TokenRate apply to it; a client that goes away
// stops it at once.
func (e *Engine) EmbeddingsHandler(withID bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := e.flavour
		body, ok := e.readBody(w, r)
		if !ok {
			return
		}
		req, inputs, err := DecodeEmbeddings(body)
		if !e.prepare(w, r, req, err) {
			return
		}
		prompt := 0
		for _, in := range inputs {
			prompt += len(strings.Fields(in)) + 1
		}
		g, end := e.begin(w, r, req, prompt, false)
		defer end()
		if g == nil {
			return
		}
		if ok, at := g.run(inputs, func(string) bool { return true }); !ok {
			g.cancelled(at)
			if g.aborted() {
				f.WriteError(w, KindEngineFailure, "request aborted")
			}
			return
		}
		g.release()
		e.completed.Add(1)
		e.Activity()
		resp := &EmbeddingsResponse{Object: "list", Model: req.ResponseModel,
			Usage: EmbeddingsUsage{PromptTokens: prompt, TotalTokens: prompt}}
		if withID {
			resp.ID = "embd-" + req.ID
			resp.Created = time.Now().Unix()
		}
		for i, in := range inputs {
			resp.Data = append(resp.Data, Embedding{Object: "embedding", Index: i, Embedding: EmbeddingOf(e.cfg.ServedName, in)})
		}
		WriteJSON(w, http.StatusOK, resp)
	})
}

// DecodeEmbeddings parses and checks an embeddings body: the request (its
// model and raw members, for the flavour's PrepareChat) and its inputs.
// Errors are *APIError.
func DecodeEmbeddings(body []byte) (*ChatRequest, []string, error) {
	if !json.Valid(body) {
		return nil, nil, &APIError{Kind: KindInvalidJSON, Message: "request body is not valid JSON"}
	}
	var in struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, nil, &APIError{Kind: KindInvalidRequest, Message: fmt.Sprintf("invalid request: %v", err)}
	}
	req := &ChatRequest{Model: in.Model}
	if err := json.Unmarshal(body, &req.Raw); err != nil {
		return nil, nil, &APIError{Kind: KindInvalidRequest, Message: "request body must be a JSON object"}
	}
	var one string
	var many []string
	switch {
	case len(in.Input) > 0 && in.Input[0] == '"' && json.Unmarshal(in.Input, &one) == nil:
		return req, []string{one}, nil
	case json.Unmarshal(in.Input, &many) == nil && len(many) > 0:
		return req, many, nil
	}
	return nil, nil, &APIError{Kind: KindInvalidRequest, Message: "input must be a string or a non-empty list of strings"}
}

// EmbeddingOf is the fake's vector for an input: EmbeddingDims floats in
// [-1, 1) from a hash of the model and the input, normalised to length 1
// (as embedding models' outputs are).
func EmbeddingOf(model, input string) []float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s", model, input)
	base := h.Sum64()
	v := make([]float64, EmbeddingDims)
	var norm float64
	for i := range v {
		x := float64(splitmix64(base+uint64(i)*0x9e3779b97f4a7c15)%2000)/1000 - 1
		v[i] = x
		norm += x * x
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range v {
			v[i] = math.Round(v[i]/norm*1e6) / 1e6
		}
	}
	return v
}

// EmbeddingsResponse is an embeddings answer.
type EmbeddingsResponse struct {
	// ID is "embd-…" (vLLM); absent otherwise.
	ID string `json:"id,omitempty"`
	// Object is "list".
	Object string `json:"object"`
	// Created is a Unix time (vLLM); absent otherwise.
	Created int64 `json:"created,omitempty"`
	// Model is the answering model's name.
	Model string `json:"model"`
	// Data holds one embedding per input, in order.
	Data []Embedding `json:"data"`
	// Usage counts the inputs' tokens.
	Usage EmbeddingsUsage `json:"usage"`
}

// Embedding is one input's vector.
type Embedding struct {
	// Object is "embedding".
	Object string `json:"object"`
	// Index is the input's position.
	Index int `json:"index"`
	// Embedding is the vector.
	Embedding []float64 `json:"embedding"`
}

// EmbeddingsUsage counts an embeddings request's tokens.
type EmbeddingsUsage struct {
	// PromptTokens counts the inputs.
	PromptTokens int `json:"prompt_tokens"`
	// TotalTokens is PromptTokens.
	TotalTokens int `json:"total_tokens"`
}
