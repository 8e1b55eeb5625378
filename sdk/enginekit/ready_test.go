// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capyctl/capyctl/sdk/engineapi"
)

// TestChatReady_PoolingModels: an embedding model is asked for an
// embedding and a reranker for a rerank (they answer no chat); an answer
// without a vector or a score is not ready.
func TestChatReady_PoolingModels(t *testing.T) {
	cases := []struct {
		api, path, answer string
		ready             bool
	}{
		{api: "embeddings", path: "/v1/embeddings", answer: `{"data":[{"embedding":[0.5,-0.5]}]}`, ready: true},
		{api: "rerank", path: "/v1/rerank", answer: `{"results":[{"index":1,"relevance_score":0.9},{"index":0,"relevance_score":0.1}]}`, ready: true},
		{api: "rerank", path: "/v1/rerank", answer: `{"results":[]}`},
	}
	for _, c := range cases {
		t.Run(c.api+" "+c.answer, func(t *testing.T) {
			var asked map[string]any
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case engineapi.ModelsPath:
					_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
				case c.path:
					_ = json.NewDecoder(r.Body).Decode(&asked)
					_, _ = io.WriteString(w, c.answer)
				default:
					http.NotFound(w, r) // a pooling model answers no chat
				}
			}))
			defer srv.Close()
			in := &Instance{API: c.api, ServedName: "m", Client: engineapi.NewEngineClient(srv.URL, "", "")}
			ready, answer, why := in.ChatReady("Reply with one word: ready", 8, nil)(context.Background())
			if ready != c.ready || (ready && answer == "") || (!ready && why == "") {
				t.Fatalf("ready %v, answer %q, why %q", ready, answer, why)
			}
			if asked["model"] != "m" {
				t.Fatalf("asked %v", asked)
			}
			if c.api == "rerank" {
				if docs, _ := asked["documents"].([]any); asked["query"] != "Reply with one word: ready" || len(docs) == 0 {
					t.Fatalf("asked %v", asked)
				}
			}
		})
	}
}
