// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// ResponseStore is what the inference API's stored-response routes read
// (core/responses.Store).
type ResponseStore interface {
	Get(owner, id string) (*structs.StoredResponse, error)
	Delete(owner, id string) error
}

// The Responses API's stored responses: GET and DELETE
// /v1/responses/{id}, GET /v1/responses/{id}/input_items. Only the key
// that created a response reads or deletes it; another key's reads as
// absent (404 response_not_found).

func (b *Backend) responseStore() ResponseStore {
	if b.Responses == nil {
		return nil
	}
	return b.Responses
}

// storedResponse finds the request's response, or answers why not.
func (b *Backend) storedResponse(w http.ResponseWriter, r *http.Request) (*structs.StoredResponse, bool) {
	w.Header().Set(router.HeaderRequestID, router.NewRequestID())
	id := mux.Vars(r)["id"]
	st := b.responseStore()
	if st == nil {
		router.WriteError(w, structs.Errf(structs.CodeResponseNotFound, "no stored response %q: this role keeps no responses", id))
		return nil, false
	}
	rec, err := st.Get(router.CallerOf(r.Context()).Key, id)
	if err != nil {
		router.WriteError(w, err)
		return nil, false
	}
	return rec, true
}

// getResponse serves GET /v1/responses/{id}: the response object as its
// client received it.
func (b *Backend) getResponse(w http.ResponseWriter, r *http.Request) {
	rec, ok := b.storedResponse(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(append([]byte(nil), rec.Response...), '\n'))
}

// deleteResponse serves DELETE /v1/responses/{id}.
func (b *Backend) deleteResponse(w http.ResponseWriter, r *http.Request) {
	rec, ok := b.storedResponse(w, r)
	if !ok {
		return
	}
	if err := b.responseStore().Delete(router.CallerOf(r.Context()).Key, rec.ID); err != nil {
		router.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": rec.ID, "object": "response", "deleted": true})
}

// responseInputItems serves GET /v1/responses/{id}/input_items: the
// items the response was asked with (this turn's, not the earlier turns'
// of its previous_response_id), oldest first, in one page.
func (b *Backend) responseInputItems(w http.ResponseWriter, r *http.Request) {
	rec, ok := b.storedResponse(w, r)
	if !ok {
		return
	}
	var items []json.RawMessage
	_ = json.Unmarshal(rec.Input, &items)
	if items == nil {
		items = []json.RawMessage{}
	}
	out := map[string]any{"object": "list", "data": items, "has_more": false, "first_id": nil, "last_id": nil}
	writeJSON(w, http.StatusOK, out)
}

var _ ResponseStore = (*responses.Store)(nil)
