// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestRole_Completions: a whole role serves POST /v1/completions to a chat
// deployment on a (fake) vLLM, woken by the request, whole and streamed,
// and lists the model's endpoints in /v1/models.
func TestRole_Completions(t *testing.T) {
	r := e2e.SwitchRole(t, map[string][]string{"vllm": nil}, map[string][2]string{"qwen": {"vllm", ""}})
	post := func(path, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, r.InferenceURL()+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+r.Creds.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, harness.ReadAll(resp)
	}
	for _, stream := range []bool{false, true} {
		body := `{"model":"qwen","prompt":"Once upon a time","max_tokens":4`
		if stream {
			body += `,"stream":true`
		}
		resp, out := post("/v1/completions", body+"}")
		if resp.StatusCode != 200 {
			t.Fatalf("stream %v: %d %s", stream, resp.StatusCode, out)
		}
		rid := resp.Header.Get(router.HeaderRequestID)
		first := out
		if stream {
			if !strings.HasSuffix(strings.TrimSpace(out), "data: [DONE]") {
				t.Fatalf("stream: %s", out)
			}
			first = strings.TrimPrefix(strings.SplitN(out, "\n", 2)[0], "data: ")
		}
		var ans struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(first), &ans); err != nil {
			t.Fatalf("stream %v: %v: %s", stream, err, out)
		}
		if ans.Object != "text_completion" || ans.ID != rid || ans.Model != "qwen" || len(ans.Choices) != 1 {
			t.Fatalf("stream %v: %s", stream, out)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, r.InferenceURL()+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+r.Creds.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if out := harness.ReadAll(resp); !strings.Contains(out, `"endpoints":["/v1/chat/completions","/v1/completions","/v1/responses","/v1/messages","/v1/messages/count_tokens"]`) {
		t.Fatalf("models: %s", out)
	}
}
