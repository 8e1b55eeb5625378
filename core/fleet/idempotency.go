// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// keyLocks serialises the requests of one Idempotency-Key.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (k *keyLocks) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*sync.Mutex{}
	}
	l := k.m[key]
	if l == nil {
		l = &sync.Mutex{}
		k.m[key] = l
	}
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		delete(k.m, key)
		k.mu.Unlock()
	}
}

// idempotent runs a server mutation under the request's Idempotency-Key,
// with the standalone role's rules (core/api): a receipt is kept for a
// mutation carried out (2xx) and an exact retry replays it (header
// Idempotent-Replayed: true); the same key with another request is
// idempotency_conflict; a refusal is not kept. The receipts live in the
// server's store.
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, body []byte, do func() (int, any, error)) {
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	if key == "" {
		status, out, err := do()
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, status, out)
		return
	}
	sum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"\n"), body...))
	hash := hex.EncodeToString(sum[:])
	unlock := s.keys.lock(key)
	defer unlock()
	if rec, err := s.o.Store.GetIdempotency(key); err == nil && rec != nil {
		if rec.BodyHash != hash {
			writeError(w, structs.Errf(structs.CodeIdempotencyConflict,
				"Idempotency-Key %q was used with another request (method, path or body); use a new key for a new request", key))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(wire.HeaderReplayed, "true")
		w.WriteHeader(rec.Status)
		_, _ = w.Write(rec.Response)
		return
	}
	status, out, err := do()
	if err != nil {
		writeError(w, err)
		return
	}
	resp, err := json.Marshal(out)
	if err != nil {
		writeError(w, structs.Wrap(structs.CodeInternal, err, "encode answer"))
		return
	}
	resp = append(resp, '\n')
	if err := s.o.Store.PutIdempotency(key, store.IdempotencyRecord{BodyHash: hash, Status: status, Response: resp, At: time.Now().UTC()}); err != nil {
		s.logger.Warn("idempotency receipt not stored", "error", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}
