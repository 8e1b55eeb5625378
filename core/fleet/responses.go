// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/structs"
)

// The Responses API's stored responses in a fleet.
//
// The server that takes a Responses request keeps its answer, in its own
// store (bbolt, core/responses), under an ID that names it: "resp_", the
// tag of the server's name (responses.NodeTag), the request's hex. The
// host that runs the model keeps nothing: the server sends it the
// conversation of the previous response and the ID in the request's
// "capyctl" member (router.RelayedResponse, honoured on the relay only),
// and reads the final response object off the answer on its way to the
// client (finalTap), storing it before the client has it.
//
// Any server answers for any ID: a previous_response_id, GET or DELETE
// naming another server's tag is asked of that server over the
// server-to-server channel (ALPN capyctl-server/1, server peer
// certificates), which checks the key as it does its own clients'. A
// response outlives its host; it is lost with its server's store (a
// removed server takes its responses with it).

// ResponseStore is what a server needs of the stored responses
// (core/responses.Store).
type ResponseStore interface {
	Enabled() bool
	Tag() string
	NewID(reqHex string) string
	Get(owner, id string) (*structs.StoredResponse, error)
	History(owner, id string) ([]json.RawMessage, error)
	Put(structs.StoredResponse)
	Delete(owner, id string) error
}

// maxPeerResponse bounds a stored response or history another server
// sends.
const maxPeerResponse = 64 << 20

func (s *Server) handleResponses(mux *http.ServeMux, bodies *router.BodyLimiter) {
	mux.HandleFunc("POST "+router.ResponsesPath, func(w http.ResponseWriter, r *http.Request) { s.relayResponses(w, r, bodies) })
	mux.HandleFunc("GET "+router.ResponsesPath+"/{id}", s.getResponse)
	mux.HandleFunc("DELETE "+router.ResponsesPath+"/{id}", s.deleteResponse)
	mux.HandleFunc("GET "+router.ResponsesPath+"/{id}/input_items", s.responseInputItems)
}

// relayResponses serves POST /v1/responses: the previous response's
// conversation and this response's ID go to the host with the request;
// the answer is kept here.
func (s *Server) relayResponses(w http.ResponseWriter, r *http.Request, bodies *router.BodyLimiter) {
	body, release, ok := readRelayBody(w, r, bodies)
	defer release()
	if !ok {
		return
	}
	var head struct {
		PreviousResponseID string          `json:"previous_response_id"`
		Store              *bool           `json:"store"`
		Input              json.RawMessage `json:"input"`
		Relayed            json.RawMessage `json:"capyctl"`
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &head); err != nil || json.Unmarshal(body, &m) != nil {
		relayError(w, r, structs.Errf(structs.CodeInvalidRequest, "the body is not a valid Responses request: %v", err))
		return
	}
	if len(head.Relayed) > 0 {
		relayError(w, r, structs.Errf(structs.CodeInvalidRequest, `"capyctl" is a member CapyCTL's servers set on the requests they relay; a client sends none`))
		return
	}
	owner := router.CallerOf(r.Context()).Key
	st := s.o.Responses
	keep := (head.Store == nil || *head.Store) && st != nil && st.Enabled()
	hex := router.NewRequestID()[len("capy-"):]
	rel := router.RelayedResponse{ResponseID: "resp_" + hex, PreviousResponseID: head.PreviousResponseID, Store: keep}
	if st != nil {
		rel.ResponseID = st.NewID(hex)
	}
	if head.PreviousResponseID != "" {
		h, err := s.responseHistory(r.Context(), owner, head.PreviousResponseID)
		if err != nil {
			relayError(w, r, err)
			return
		}
		rel.History = h
	}
	m["capyctl"], _ = json.Marshal(rel)
	out, err := json.Marshal(m)
	if err != nil {
		relayError(w, r, structs.Wrap(structs.CodeInternal, err, "encode the relayed request"))
		return
	}
	var tap func(*http.Response)
	if keep {
		input := head.Input
		var text string
		if json.Unmarshal(input, &text) == nil {
			input, _ = json.Marshal([]map[string]string{{"role": "user", "content": text}})
		}
		created := time.Now().UTC()
		tap = func(resp *http.Response) {
			if resp.StatusCode != http.StatusOK {
				return
			}
			resp.Body = newFinalTap(resp, func(obj json.RawMessage) {
				st.Put(structs.StoredResponse{ID: rel.ResponseID, Owner: owner, CreatedAt: created,
					PreviousID: head.PreviousResponseID, Input: input, Response: obj})
			})
		}
	}
	s.relayBody(w, r, out, tap)
}

// ownerOf is the server that holds a stored response: this one (""), or
// another member's cluster address; response_not_found for an ID no
// member's tag names.
func (s *Server) ownerOf(id string) (string, error) {
	st := s.o.Responses
	if st == nil || !st.Enabled() {
		return "", structs.Errf(structs.CodeResponseNotFound, "no stored response %q: this server keeps no responses (responses.retention)", id)
	}
	tag := responses.TagOf(id)
	if tag == st.Tag() || s.cl == nil {
		return "", nil
	}
	for _, m := range s.cl.node.Stats().Servers {
		if m.ID != s.cl.name && responses.NodeTag(m.ID) == tag {
			return m.Address, nil
		}
	}
	return "", structs.Errf(structs.CodeResponseNotFound, "no stored response %q: no server of the cluster holds it (its server was removed, or it is not one of CapyCTL's IDs)", id)
}

// responseHistory is a previous response's conversation, from the server
// that holds it.
func (s *Server) responseHistory(ctx context.Context, owner, id string) ([]json.RawMessage, error) {
	addr, err := s.ownerOf(id)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return s.o.Responses.History(owner, id)
	}
	var out struct {
		Items []json.RawMessage `json:"items"`
	}
	return out.Items, s.peerResponse(ctx, http.MethodGet, addr, "history", owner, id, &out)
}

// storedResponse is a stored response, from the server that holds it.
func (s *Server) storedResponse(ctx context.Context, owner, id string) (*structs.StoredResponse, error) {
	addr, err := s.ownerOf(id)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return s.o.Responses.Get(owner, id)
	}
	var rec structs.StoredResponse
	return &rec, s.peerResponse(ctx, http.MethodGet, addr, "record", owner, id, &rec)
}

// peerResponse asks the server at addr for a stored response's record or
// history, or to delete it.
func (s *Server) peerResponse(ctx context.Context, method, addr, what, owner, id string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	q := url.Values{"owner": {owner}, "id": {id}}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+"/responses/"+what+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := s.cl.client.Do(req)
	if err != nil {
		return structs.Wrap(structs.CodeUnavailable, err, "server %s holds response %s and is out of reach", addr, id).WithDetail("server", addr)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPeerResponse))
	if err != nil {
		return structs.Wrap(structs.CodeUnavailable, err, "read server %s's answer", addr)
	}
	if resp.StatusCode/100 != 2 {
		var env wire.ErrorEnvelope
		if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
			return structs.Errf(structs.Code(env.Error.Code), "%s", env.Error.Message)
		}
		return structs.Errf(structs.CodeInternal, "server %s answered %d", addr, resp.StatusCode)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// servePeerResponses answers another server's questions on the stored
// responses it holds: GET /responses/record, GET /responses/history,
// DELETE /responses/record (?owner=&id=). The owner is checked here, as
// for this server's own clients.
func (s *Server) servePeerResponses(w http.ResponseWriter, r *http.Request) {
	st := s.o.Responses
	owner, id := r.URL.Query().Get("owner"), r.URL.Query().Get("id")
	if st == nil || !st.Enabled() {
		writeLinkError(w, structs.Errf(structs.CodeResponseNotFound, "server %s keeps no responses", s.o.Name))
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/responses/record":
		rec, err := st.Get(owner, id)
		if err != nil {
			writeLinkError(w, err)
			return
		}
		writeJSONAnswer(w, rec)
	case r.Method == http.MethodGet && r.URL.Path == "/responses/history":
		items, err := st.History(owner, id)
		if err != nil {
			writeLinkError(w, err)
			return
		}
		writeJSONAnswer(w, map[string]any{"items": items})
	case r.Method == http.MethodDelete && r.URL.Path == "/responses/record":
		if err := st.Delete(owner, id); err != nil {
			writeLinkError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	}
}

// getResponse serves GET /v1/responses/{id}.
func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(router.HeaderRequestID, router.NewRequestID())
	rec, err := s.storedResponse(r.Context(), router.CallerOf(r.Context()).Key, r.PathValue("id"))
	if err != nil {
		router.WriteError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(append([]byte(nil), rec.Response...), '\n'))
}

// responseInputItems serves GET /v1/responses/{id}/input_items.
func (s *Server) responseInputItems(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(router.HeaderRequestID, router.NewRequestID())
	rec, err := s.storedResponse(r.Context(), router.CallerOf(r.Context()).Key, r.PathValue("id"))
	if err != nil {
		router.WriteError(w, err)
		return
	}
	var items []json.RawMessage
	_ = json.Unmarshal(rec.Input, &items)
	if items == nil {
		items = []json.RawMessage{}
	}
	writeJSONAnswer(w, map[string]any{"object": "list", "data": items, "has_more": false, "first_id": nil, "last_id": nil})
}

// deleteResponse serves DELETE /v1/responses/{id}.
func (s *Server) deleteResponse(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(router.HeaderRequestID, router.NewRequestID())
	owner, id := router.CallerOf(r.Context()).Key, r.PathValue("id")
	addr, err := s.ownerOf(id)
	if err == nil {
		if addr == "" {
			err = s.o.Responses.Delete(owner, id)
		} else {
			err = s.peerResponse(r.Context(), http.MethodDelete, addr, "record", owner, id, nil)
		}
	}
	if err != nil {
		router.WriteError(w, err)
		return
	}
	writeJSONAnswer(w, map[string]any{"id": id, "object": "response", "deleted": true})
}

// finalTap reads a host's Responses answer on its way to the client and
// hands over the final response object the moment it has it, before the
// bytes that end it are read on: the last event of a stream
// (response.completed or response.incomplete), or a whole answer once its
// Content-Length is in. A client that names the response right after it
// got it finds it stored.
type finalTap struct {
	rc    io.ReadCloser
	sse   bool
	want  int64
	buf   []byte
	found func(json.RawMessage)
	done  bool
}

func newFinalTap(resp *http.Response, found func(json.RawMessage)) *finalTap {
	ct := resp.Header.Get("Content-Type")
	return &finalTap{rc: resp.Body, sse: len(ct) >= 17 && ct[:17] == "text/event-stream", want: resp.ContentLength, found: found}
}

func (f *finalTap) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if n > 0 && !f.done {
		f.scan(p[:n])
	}
	if err == io.EOF && !f.done && !f.sse {
		f.whole()
	}
	return n, err
}

func (f *finalTap) Close() error { return f.rc.Close() }

func (f *finalTap) scan(b []byte) {
	f.buf = append(f.buf, b...)
	if len(f.buf) > maxPeerResponse {
		f.done, f.buf = true, nil // larger than any answer kept
		return
	}
	if !f.sse {
		if f.want >= 0 && int64(len(f.buf)) >= f.want {
			f.whole()
		}
		return
	}
	for !f.done {
		i := bytes.Index(f.buf, []byte("\n\n"))
		if i < 0 {
			return
		}
		ev := f.buf[:i]
		f.buf = f.buf[i+2:]
		for _, line := range bytes.Split(ev, []byte("\n")) {
			data, ok := bytes.CutPrefix(line, []byte("data: "))
			if !ok {
				continue
			}
			var v struct {
				Type     string          `json:"type"`
				Response json.RawMessage `json:"response"`
			}
			if json.Unmarshal(data, &v) == nil && (v.Type == "response.completed" || v.Type == "response.incomplete") && len(v.Response) > 0 {
				f.done, f.buf = true, nil
				f.found(v.Response)
			}
		}
	}
}

func (f *finalTap) whole() {
	f.done = true
	var v struct {
		Object string `json:"object"`
		Status string `json:"status"`
	}
	if json.Unmarshal(f.buf, &v) == nil && v.Object == "response" && (v.Status == "completed" || v.Status == "incomplete") {
		f.found(append(json.RawMessage(nil), bytes.TrimSpace(f.buf)...))
	}
	f.buf = nil
}
