// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import "time"

// RequestsResponse answers GET /management/v1/requests: the request log's
// newest records, newest first.
type RequestsResponse struct {
	APIVersion string          `json:"api_version"`
	At         time.Time       `json:"at"`
	Requests   []RequestRecord `json:"requests"`
}

// RequestRecord is one request as the request log keeps it: never its
// text, never the client's own request ID.
type RequestRecord struct {
	ID         string `json:"id"`
	Deployment string `json:"deployment"`
	Instance   string `json:"instance,omitempty"`
	// Route is the inference API the request came to: chat, completions,
	// embeddings, rerank, decisions, responses, messages, count_tokens.
	Route          string    `json:"route"`
	Stream         bool      `json:"stream"`
	Outcome        string    `json:"outcome"`
	Code           string    `json:"code,omitempty"`
	Status         int       `json:"status"`
	ReceivedAt     time.Time `json:"received_at"`
	QueueMs        float64   `json:"queue_ms,omitempty"`
	ActivationMs   float64   `json:"activation_ms,omitempty"`
	TTFBMs         float64   `json:"ttfb_ms,omitempty"`
	TotalMs        float64   `json:"total_ms"`
	PromptTokens   int64     `json:"prompt_tokens,omitempty"`
	CompletionToks int64     `json:"completion_tokens,omitempty"`
	// Key is the name of the API key the request carried.
	Key string `json:"key,omitempty"`
}
