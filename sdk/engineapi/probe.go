// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ModelsPath is the OpenAI model list.
const ModelsPath = "/v1/models"

// ModelsContain reports whether the engine's OpenAI model list (GET
// /v1/models, data[].id) names name. A non-2xx answer is an *HTTPError.
func ModelsContain(ctx context.Context, c *EngineClient, name string) (bool, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if _, err := c.GetJSON(ctx, ModelsPath, &list); err != nil {
		return false, fmt.Errorf("list models: %w", err)
	}
	for _, m := range list.Data {
		if m.ID == name {
			return true, nil
		}
	}
	return false, nil
}

// ChatProbe sends one short, non-streamed chat request at temperature 0 and
// returns the answer: choices[0].message.content, or, when that is empty,
// reasoning_content or reasoning (a model that thinks first has still
// answered, so the engine is ready). An engine error is an *HTTPError with
// the status and the engine's message; an empty answer is an error too.
func ChatProbe(ctx context.Context, c *EngineClient, path, servedName, prompt string, maxTokens int) (string, error) {
	return ChatProbeExtra(ctx, c, path, servedName, prompt, maxTokens, nil)
}

// ChatProbeExtra is ChatProbe with extra request fields merged into the
// body (SGLang's {"chat_template_kwargs": {"enable_thinking": false}}, a
// request ID); they may override the defaults.
func ChatProbeExtra(ctx context.Context, c *EngineClient, path, servedName, prompt string, maxTokens int, extra map[string]any) (string, error) {
	body := map[string]any{
		"model":       servedName,
		"messages":    []map[string]string{{"role": "user", "content": prompt}},
		"temperature": 0,
		"stream":      false,
	}
	if maxTokens > 0 {
		body["max_tokens"] = maxTokens
	}
	for k, v := range extra {
		body[k] = v
	}
	var answer json.RawMessage
	if _, err := c.PostJSON(ctx, path, body, &answer); err != nil {
		return "", fmt.Errorf("chat probe: %w", err)
	}
	text, err := ChatAnswer(answer)
	if err != nil {
		return "", fmt.Errorf("chat probe: %w", err)
	}
	return text, nil
}

// ChatAnswer extracts the answer from an OpenAI chat completion: the first
// choice's content (a string, or text parts), else its reasoning_content,
// else its reasoning.
func ChatAnswer(body []byte) (string, error) {
	var resp struct {
		Choices []struct {
			Message struct {
				Content          json.RawMessage `json:"content"`
				ReasoningContent *string         `json:"reasoning_content"`
				Reasoning        *string         `json:"reasoning"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return "", fmt.Errorf("decode chat answer: %w", err)
	}
	if len(resp.Choices) == 0 {
		if msg := EngineMessage(body); strings.Contains(string(body), `"error"`) && msg != "" {
			return "", fmt.Errorf("no choices in chat answer: %s", msg)
		}
		return "", errors.New("no choices in chat answer")
	}
	ch := resp.Choices[0]
	if s := contentText(ch.Message.Content); strings.TrimSpace(s) != "" {
		return s, nil
	}
	for _, r := range []*string{ch.Message.ReasoningContent, ch.Message.Reasoning} {
		if r != nil && strings.TrimSpace(*r) != "" {
			return *r, nil
		}
	}
	finish := ""
	if ch.FinishReason != nil {
		finish = *ch.FinishReason
	}
	return "", fmt.Errorf("empty chat answer (finish_reason %q)", finish)
}

// contentText reads a message content: a string, null, or a list of parts
// of which the text ones are joined.
func contentText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "" || p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	return ""
}

// EmbeddingsPath is the OpenAI embeddings endpoint (vLLM, SGLang and
// llama-server serve it there).
const EmbeddingsPath = "/v1/embeddings"

// EmbeddingsProbe asks an embedding model for the embedding of input and
// returns the start of the vector (at most 16 values) as text: the canary
// of an engine that answers no chat. An answer without a vector is an
// error.
func EmbeddingsProbe(ctx context.Context, c *EngineClient, servedName, input string) (string, error) {
	var answer struct {
		Data []struct {
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
	}
	if _, err := c.PostJSON(ctx, EmbeddingsPath, map[string]any{"model": servedName, "input": input}, &answer); err != nil {
		return "", fmt.Errorf("embeddings probe: %w", err)
	}
	if len(answer.Data) == 0 || len(answer.Data[0].Embedding) == 0 {
		return "", errors.New("embeddings probe: the answer has no vector")
	}
	v := answer.Data[0].Embedding
	b, _ := json.Marshal(v[:min(len(v), 16)])
	return string(b), nil
}

// RerankPath is the rerank endpoint (vLLM serves it for a cross-encoder,
// llama-server when started with --reranking).
const RerankPath = "/v1/rerank"

// RerankProbe asks a reranker to score documents against query and
// returns the scores, best first, as text: the canary of an engine that
// answers no chat. An answer without a score is an error.
func RerankProbe(ctx context.Context, c *EngineClient, servedName, query string, documents []string) (string, error) {
	var answer struct {
		Results []struct {
			Index          int      `json:"index"`
			RelevanceScore *float64 `json:"relevance_score"`
		} `json:"results"`
	}
	if _, err := c.PostJSON(ctx, RerankPath, map[string]any{"model": servedName, "query": query, "documents": documents}, &answer); err != nil {
		return "", fmt.Errorf("rerank probe: %w", err)
	}
	if len(answer.Results) == 0 || answer.Results[0].RelevanceScore == nil {
		return "", errors.New("rerank probe: the answer has no score")
	}
	b, _ := json.Marshal(answer.Results)
	return string(b), nil
}

// RerankCanaryDocuments are the documents a readiness or wake check asks
// a reranker to score against its canary prompt.
var RerankCanaryDocuments = []string{"a short answer", "an unrelated sentence"}
