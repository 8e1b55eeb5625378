// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import "time"

// Engine families with a first-party driver.
const (
	FamilyVLLM       = "vllm"
	FamilySGLang     = "sglang"
	FamilyLlamaCpp   = "llamacpp"
	FamilyTensorFold = "tensorfold"
	FamilyCustom     = "custom"
)

// EngineRecord is a registered engine installation.
type EngineRecord struct {
	Name     string `json:"name"`
	Family   string `json:"family"`
	Path     string `json:"path"`
	Program  string `json:"program"`
	Version  string `json:"version"`
	Verified bool   `json:"verified"`
	// Digest is the pinned "sha256:<hex>" of the installation; a launch of a
	// changed installation is refused installation_drift.
	Digest    string            `json:"digest"`
	Details   map[string]string `json:"details,omitempty"`
	Approvals Approvals         `json:"approvals"`
	// Env is added to every launch of this engine (approved by the host when
	// it registered it).
	Env     map[string]string `json:"env,omitempty"`
	AddedAt time.Time         `json:"added_at"`
}

// Approvals are what the host allows deployments on an engine to set.
type Approvals struct {
	Options    []string `json:"options,omitempty"`
	Paths      []string `json:"paths,omitempty"`
	Env        []string `json:"env,omitempty"`
	RemoteCode bool     `json:"remote_code,omitempty"`
}

// Event is one entry of the store's journal, the source of the resumable
// event stream.
type Event struct {
	Seq        uint64         `json:"seq"`
	At         time.Time      `json:"at"`
	Kind       string         `json:"kind"`
	Deployment string         `json:"deployment,omitempty"`
	Instance   string         `json:"instance,omitempty"`
	Payload    map[string]any `json:"payload,omitempty"`
}

// RequestRecord is one request of the request ledger. It never holds prompt
// or answer text.
type RequestRecord struct {
	ID              string    `json:"id"`
	ClientRequestID string    `json:"client_request_id,omitempty"`
	Deployment      string    `json:"deployment"`
	Instance        string    `json:"instance,omitempty"`
	API             string    `json:"api"`
	Stream          bool      `json:"stream"`
	Outcome         string    `json:"outcome"`
	Code            string    `json:"code,omitempty"`
	Status          int       `json:"status"`
	ReceivedAt      time.Time `json:"received_at"`
	QueueMs         float64   `json:"queue_ms,omitempty"`
	ActivationMs    float64   `json:"activation_ms,omitempty"`
	TTFBMs          float64   `json:"ttfb_ms,omitempty"`
	TotalMs         float64   `json:"total_ms"`
	BytesIn         int64     `json:"bytes_in"`
	BytesOut        int64     `json:"bytes_out"`
	PromptTokens    int64     `json:"prompt_tokens,omitempty"`
	CompletionToks  int64     `json:"completion_tokens,omitempty"`
	// Key is the name of the API key the request carried.
	Key string `json:"key,omitempty"`
}
