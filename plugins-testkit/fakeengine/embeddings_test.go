// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// TestEngine_Embeddings: the flavours whose engine serves POST
// /v1/embeddings answer in OpenAI's shape (vLLM's with an id, SGLang's and
// llama-server's without), one deterministic vector per input with the
// usage; llama-server only when started with --embeddings (else 501, as
// the real one); the others have no such route.
func TestEngine_Embeddings(t *testing.T) {
	cases := []struct {
		name    string
		flavour fakeengine.Flavour
		header  map[string]string
		status  int    // for a valid request
		wantID  string // the answer's id ("" none)
	}{
		{name: "openai", flavour: fakeengine.OpenAI{}, header: map[string]string{"X-Request-Id": "r1"}, status: 200, wantID: "embd-r1"},
		{name: "vllm", flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{}), header: map[string]string{"X-Request-Id": "r1"}, status: 200, wantID: "embd-r1"},
		{name: "sglang", flavour: fakeengine.NewSGLang(fakeengine.SGLangOptions{}), status: 200},
		{name: "llamacpp --embeddings", flavour: fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{Embeddings: true}), status: 200},
		{name: "llamacpp without --embeddings", flavour: fakeengine.NewLlamaCpp(fakeengine.LlamaCppOptions{}), status: 501},
		{name: "tensorfold", flavour: fakeengine.NewTensorFold(fakeengine.TensorFoldOptions{}), status: 404},
	}
	type answer struct {
		ID     *string `json:"id"`
		Object string  `json:"object"`
		Model  string  `json:"model"`
		Data   []struct {
			Object    string    `json:"object"`
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			te := startEngine(t, fakeengine.Config{Flavour: c.flavour}, true)
			hdr := map[string]string{"Content-Type": "application/json"}
			for k, v := range c.header {
				hdr[k] = v
			}
			status, data, _ := do(t, http.MethodPost, te.url+"/v1/embeddings", `{"model":"m","input":["one two","three"]}`, hdr)
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
			if out.Object != "list" || out.Model != "m" || len(out.Data) != 2 || out.Usage.PromptTokens != 5 || out.Usage.TotalTokens != 5 {
				t.Fatalf("answer: %s", data)
			}
			switch {
			case c.wantID == "" && out.ID != nil, c.wantID != "" && (out.ID == nil || *out.ID != c.wantID):
				t.Fatalf("id: %s", data)
			}
			for i, d := range out.Data {
				want := fakeengine.EmbeddingOf("m", []string{"one two", "three"}[i])
				if d.Object != "embedding" || d.Index != i || len(d.Embedding) != fakeengine.EmbeddingDims || !equalFloats(d.Embedding, want) {
					t.Fatalf("data[%d] = %+v, want %v", i, d, want)
				}
			}
			// The same input gets the same vector, alone or in a list.
			status, data, _ = do(t, http.MethodPost, te.url+"/v1/embeddings", `{"model":"m","input":"three"}`, hdr)
			var one answer
			if status != 200 || json.Unmarshal(data, &one) != nil || len(one.Data) != 1 || !equalFloats(one.Data[0].Embedding, out.Data[1].Embedding) {
				t.Fatalf("one input: %d %s", status, data)
			}
			// An input is required (llama-server b4748 answers every client
			// error 500).
			status, data, _ = do(t, http.MethodPost, te.url+"/v1/embeddings", `{"model":"m"}`, hdr)
			if (status != 400 && !(status == 500 && strings.HasPrefix(c.name, "llamacpp"))) || !strings.Contains(string(data), "input") {
				t.Fatalf("no input: %d %s", status, data)
			}
			if st := te.Stats(); st.Total != 2 || st.Completed != 2 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
