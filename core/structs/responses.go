// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"encoding/json"
	"time"
)

// StoredResponse is one answer of the OpenAI Responses API (POST
// /v1/responses) kept for GET /v1/responses/{id} and for a later
// request's previous_response_id. Only the API key that created it reads
// it. It holds prompts and answers: it lives in the role's owner-only
// store and never in a log.
type StoredResponse struct {
	// ID is the response's "resp_…" ID.
	ID string `json:"id"`
	// Owner is the identity of the API key that created it (its name).
	Owner string `json:"owner"`
	// CreatedAt is when the request arrived.
	CreatedAt time.Time `json:"created_at"`
	// PreviousID is the stored response this one continued ("" for none).
	PreviousID string `json:"previous_id,omitempty"`
	// Input is this turn's input items, a JSON array, in the order the
	// client sent them (a string input is stored as one user message).
	// The turns before it are PreviousID's.
	Input json.RawMessage `json:"input"`
	// Response is the response object as the client received it.
	Response json.RawMessage `json:"response"`
}

// Size is the record's weight against the store's size bound.
func (r *StoredResponse) Size() int64 {
	return int64(len(r.ID) + len(r.Owner) + len(r.PreviousID) + len(r.Input) + len(r.Response) + 64)
}
