// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// embeddingsAnswer is an embeddings answer as the tests read it.
type embeddingsAnswer struct {
	ID     *string `json:"id"`
	Object string  `json:"object"`
	Model  string  `json:"model"`
	Data   []struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	} `json:"data"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
	CapyCTL *struct {
		Metrics map[string]struct {
			Value  float64 `json:"value"`
			Source string  `json:"source"`
		} `json:"metrics"`
	} `json:"capyctl"`
}

// TestRouter_Embeddings routes POST /v1/embeddings to an embeddings
// deployment, on an engine whose answer has an id (vLLM's shape: it becomes
// the request ID) and on one whose answer has none (SGLang's and
// llama-server's: none is added), for one input and for several: OpenAI's
// list of vectors under the public model name, with usage,
// capyctl.metrics and the request ID header.
func TestRouter_Embeddings(t *testing.T) {
	cases := []struct {
		name    string
		flavour fakeengine.Flavour
		input   string
		n       int
		engID   bool
	}{
		{name: "one input, answer with an id", input: `"hello world"`, n: 1, engID: true},
		{name: "three inputs, answer with an id", input: `["a","b c","d"]`, n: 3, engID: true},
		{name: "one input, answer without an id", flavour: fakeengine.NewSGLang(fakeengine.SGLangOptions{}), input: `"hello world"`, n: 1},
		{name: "two inputs, answer without an id", flavour: fakeengine.NewSGLang(fakeengine.SGLangOptions{}), input: `["x","y"]`, n: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{api: structs.APIEmbeddings, engine: fakeengine.Config{Flavour: c.flavour},
				ep: func(ep *structs.EngineEndpoint) {
					if c.flavour != nil { // SGLang takes the request ID in the body, and aborts by it
						ep.RequestIDField, ep.AbortByID = "rid", true
					}
				}})
			var out embeddingsAnswer
			body, rid := postForJSON(t, e, "/v1/embeddings", `{"model":"demo","input":`+c.input+`}`, &out)
			if out.Object != "list" || out.Model != "demo" || len(out.Data) != c.n {
				t.Fatalf("answer: %s", body)
			}
			switch {
			case c.engID && (out.ID == nil || *out.ID != rid):
				t.Fatalf("id %v, want the request ID %s: %s", out.ID, rid, body)
			case !c.engID && out.ID != nil:
				t.Fatalf("an id was added to an answer without one: %s", body)
			}
			for i, d := range out.Data {
				if d.Object != "embedding" || d.Index != i || len(d.Embedding) != fakeengine.EmbeddingDims {
					t.Fatalf("data[%d]: %s", i, body)
				}
			}
			if out.Usage == nil || out.Usage.PromptTokens == 0 || out.Usage.TotalTokens != out.Usage.PromptTokens {
				t.Fatalf("usage: %s", body)
			}
			if out.CapyCTL == nil || out.CapyCTL.Metrics["input_tokens"].Value != float64(out.Usage.PromptTokens) ||
				out.CapyCTL.Metrics["total_ms"].Source != "router" {
				t.Fatalf("metrics: %s", body)
			}
			if _, ok := out.CapyCTL.Metrics["ttft_ms"]; ok {
				t.Fatalf("an embeddings answer has no first token: %s", body)
			}
			if st := e.eng.Stats(); st.Total != 1 || st.Completed != 1 {
				t.Fatalf("engine stats: %+v", st)
			}
			waitFor(t, "idle", e.idle)
		})
	}
}

// TestRouter_EmbeddingsHangUpCancelsOnTheEngine: a client that goes away
// ends the embeddings request on the engine by closing its connection; no
// abort by request ID is asked for (the engine never had it).
func TestRouter_EmbeddingsHangUpCancelsOnTheEngine(t *testing.T) {
	checkHangUpClosesOnTheEngine(t, structs.APIEmbeddings, "/v1/embeddings", `{"model":"demo","input":["a","b"]}`)
}

// TestRouter_EmbeddingsAPIMismatch: embeddings for a chat model, and chat
// or a text completion for an embeddings model, are refused with
// api_mismatch naming the model's endpoint, before anything wakes.
func TestRouter_EmbeddingsAPIMismatch(t *testing.T) {
	checkAPIMismatch(t, []apiMismatchCase{
		{name: "embeddings to a chat model", api: structs.APIChat, path: "/v1/embeddings", body: `{"model":"demo","input":"x"}`, wantEndpoint: "/v1/chat/completions"},
		{name: "chat to an embeddings model", api: structs.APIEmbeddings, path: "/v1/chat/completions", body: chatBody(false, ""), wantEndpoint: "/v1/embeddings"},
		{name: "completions to an embeddings model", api: structs.APIEmbeddings, path: "/v1/completions", body: completionsBody(false, ""), wantEndpoint: "/v1/embeddings"},
		{name: "embeddings to a decision model", api: structs.APIDecisions, path: "/v1/embeddings", body: `{"model":"demo","input":"x"}`, wantEndpoint: "/v1/systemone"},
	})
}

// TestRouter_EmbeddingsNeedAnInput: a body without an input is refused
// before anything wakes.
func TestRouter_EmbeddingsNeedAnInput(t *testing.T) {
	checkInvalidBeforeWake(t, structs.APIEmbeddings, "/v1/embeddings",
		`{"model":"demo"}`, `{"model":"demo","input":null}`)
}
