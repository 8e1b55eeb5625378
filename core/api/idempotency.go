// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// maxIdempotencyKey bounds an Idempotency-Key.
const maxIdempotencyKey = 128

// keyLocks serialises requests that carry the same idempotency key, so two
// concurrent retries cannot both apply: the second waits and replays the
// first one's receipt.
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

func (k *keyLocks) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// validKey accepts 1–128 printable ASCII characters without spaces.
func validKey(key string) bool {
	if len(key) == 0 || len(key) > maxIdempotencyKey {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] > '~' {
			return false
		}
	}
	return true
}

// Receipts run mutations under their Idempotency-Key with the management
// API's rules, the receipts kept in a role's store: the server role's
// answers from its hosts (core/fleet) use it as the management API does.
type Receipts struct {
	Store  *store.Store
	Logger hclog.Logger
	keys   keyLocks
}

// Run runs do under the request's Idempotency-Key (see idempotent).
func (rc *Receipts) Run(w http.ResponseWriter, r *http.Request, body []byte, do func() (int, any, error)) {
	logger := rc.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	runIdempotent(rc.Store, &rc.keys, logger, w, r, body, do)
}

// idempotent runs a mutation under the request's Idempotency-Key, if any.
// IMPORTANT: a receipt is kept only for a mutation that was carried out
// (2xx): an exact retry replays it (Idempotent-Replayed: true) without
// doing anything; the same key with another method, path or body is
// idempotency_conflict. A refusal is not kept, so a retry after the cause
// is fixed goes through. do returns the status and the answer.
func (b *Backend) idempotent(w http.ResponseWriter, r *http.Request, body []byte, do func() (int, any, error)) {
	runIdempotent(b.Store, &b.keys, b.logger(), w, r, body, do)
}

func runIdempotent(st *store.Store, keys *keyLocks, logger hclog.Logger, w http.ResponseWriter, r *http.Request, body []byte, do func() (int, any, error)) {
	key := r.Header.Get(wire.HeaderIdempotencyKey)
	if key == "" {
		status, out, err := do()
		if err != nil {
			writeMgmtError(w, err)
			return
		}
		writeJSON(w, status, out)
		return
	}
	if !validKey(key) {
		writeMgmtError(w, structs.Errf(structs.CodeInvalidRequest,
			"Idempotency-Key must be 1 to %d printable ASCII characters without spaces", maxIdempotencyKey))
		return
	}
	sum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"\n"), body...))
	hash := hex.EncodeToString(sum[:])
	unlock := keys.lock(key)
	defer unlock()
	if rec, err := st.GetIdempotency(key); err == nil && rec != nil {
		if rec.BodyHash != hash {
			writeMgmtError(w, structs.Errf(structs.CodeIdempotencyConflict,
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
		writeMgmtError(w, err)
		return
	}
	resp, err := json.Marshal(out)
	if err != nil {
		writeMgmtError(w, structs.Wrap(structs.CodeInternal, err, "encode answer"))
		return
	}
	resp = append(resp, '\n')
	if err := st.PutIdempotency(key, store.IdempotencyRecord{BodyHash: hash, Status: status, Response: resp, At: time.Now().UTC()}); err != nil {
		logger.Warn("idempotency receipt not stored", "error", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}
