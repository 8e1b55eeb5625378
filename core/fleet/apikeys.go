// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// The inference API's named keys are the cluster's: their records live in
// the replicated state (fsm.KeyCreated, KeyUpdated, KeyRevoked), so a key
// created or revoked through any server is committed through the leader
// and applied by every server, whose keeper reloads as soon as its state
// applied the change (FollowKeys: on the state's change signal, no poll).
// A revocation therefore takes effect on every server as fast as raft
// replicates an entry (milliseconds on a LAN; the test bounds it at a
// second).
//
// Their limits hold across the servers by shared counts: every
// keyCountsEvery each server tells the others, for each key with limits,
// how many requests it admitted and how many tokens its answers used
// since it started, how many run there now and how many tokens the key
// used there this month (apikeys.Counts). A server takes the others'
// requests and tokens off its own buckets, and adds their running
// requests and month's tokens to its own when it decides. The tolerance:
// within one interval (plus a round trip) each server decides on its
// own view, so a key can go over a per-minute limit by what it sends
// through the other servers in that interval, over its concurrency by
// the requests that start on several servers in it, and over its monthly
// budget likewise. A server silent for keyCountsStale counts no more.
// Usage is counted by the server that took the request (its own store)
// and summed across the servers when asked (capyctl usage).

// Intervals of the shared counts.
const (
	keyCountsEvery = 200 * time.Millisecond
	// keyCountsResend is how often unchanged counts are sent anyway, so
	// that a receiver knows the sender is alive.
	keyCountsResend = 2 * time.Second
	keyCountsStale  = 10 * time.Second
)

// keyBackend keeps the keys in the replicated state (apikeys.Backend):
// every change is a command committed through the leader.
type keyBackend struct{ s *Server }

// KeyBackend returns the cluster's keys as an apikeys.Backend.
func (s *Server) KeyBackend() apikeys.Backend { return keyBackend{s} }

// Keys implements apikeys.Backend. Until the cluster recorded its own key
// (SeedRoleKey), the role's key is the key named default as before.
func (b keyBackend) Keys() ([]structs.APIKey, error) {
	keys := b.s.State.APIKeys()
	if !b.s.State.KeysSeeded() {
		keys = append(keys, apikeys.RoleKeyRecord(time.Now()))
	}
	return keys, nil
}

// CreateKey implements apikeys.Backend.
func (b keyBackend) CreateKey(k *structs.APIKey) error { return b.s.apply(fsm.KeyCreated{Key: *k}) }

// UpdateKey implements apikeys.Backend.
func (b keyBackend) UpdateKey(k *structs.APIKey) error { return b.s.apply(fsm.KeyUpdated{Key: *k}) }

// RevokeKey implements apikeys.Backend.
func (b keyBackend) RevokeKey(name string) error {
	if !b.s.State.KeysSeeded() && name == structs.DefaultKeyName {
		// The implicit default: record it, so that its revocation is the
		// cluster's.
		if err := b.s.seedRoleKey(); err != nil {
			return err
		}
	}
	return b.s.apply(fsm.KeyRevoked{Name: name})
}

// seedRoleKey records the cluster's own key as the key named default,
// once per cluster (a no-op after: every server proposes it).
func (s *Server) seedRoleKey() error {
	if s.State.KeysSeeded() {
		return nil
	}
	return s.apply(fsm.KeyCreated{Key: apikeys.RoleKeyRecord(time.Now()), Seed: true})
}

// UseKeys hands the server its keeper of the cluster's keys: it reloads
// on every change of the replicated keys, shares its counts with the
// other servers, and the cluster records its own key as the key named
// default once a leader takes the command. Call after Start.
func (s *Server) UseKeys(k *apikeys.Keeper) {
	s.mu.Lock()
	s.keys = k
	s.mu.Unlock()
	s.goRun(func() { s.followKeys(k) })
	s.goRun(func() { s.shareKeyCounts(k) })
	s.goRun(s.seedWhenLed)
}

// followKeys reloads the keeper whenever the replicated keys changed,
// taking the state's signal before it reads, so no change is missed.
func (s *Server) followKeys(k *apikeys.Keeper) {
	seen := s.State.KeysVersion()
	seeded := s.State.KeysSeeded()
	for {
		changed := s.State.Changed()
		if v, sd := s.State.KeysVersion(), s.State.KeysSeeded(); v != seen || sd != seeded {
			if err := k.Reload(); err != nil {
				s.logger.Warn("reload the API keys", "error", err)
			} else {
				seen, seeded = v, sd
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-changed:
		}
	}
}

// seedWhenLed proposes the cluster's own key until the state holds it,
// on the raft node's change signal (a leader elected, an entry applied).
func (s *Server) seedWhenLed() {
	for {
		ch, raftCh := s.State.Changed(), s.cl.node.Changed()
		if s.State.KeysSeeded() {
			return
		}
		if st := s.cl.node.Stats(); st.LeaderID != "" {
			if err := s.seedRoleKey(); err != nil && !structs.AsError(err).Info().Retryable {
				s.logger.Warn("record the cluster's key as the key named default", "error", err)
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-ch:
		case <-raftCh:
		}
	}
}

// keyCountsReport is POST /key-counts between servers.
type keyCountsReport struct {
	Server string                    `json:"server"`
	Counts map[string]apikeys.Counts `json:"counts"`
}

// shareKeyCounts tells the other servers this server's counts of the keys
// with limits, every keyCountsEvery when they changed (every
// keyCountsResend anyway), and forgets servers gone or silent.
func (s *Server) shareKeyCounts(k *apikeys.Keeper) {
	t := time.NewTicker(keyCountsEvery)
	defer t.Stop()
	var last []byte
	var lastSent time.Time
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		st := s.cl.node.Stats()
		live := map[string]bool{}
		var peers []string
		for _, m := range st.Servers {
			live[m.ID] = true
			if m.ID != s.cl.name {
				peers = append(peers, m.Address)
			}
		}
		k.ForgetPeers(live, keyCountsStale)
		counts := k.Counts()
		if len(counts) == 0 || len(peers) == 0 {
			continue
		}
		data, err := json.Marshal(keyCountsReport{Server: s.cl.name, Counts: counts})
		if err != nil {
			continue
		}
		if string(data) == string(last) && time.Since(lastSent) < keyCountsResend {
			continue
		}
		last, lastSent = data, time.Now()
		var wg sync.WaitGroup
		for _, addr := range peers {
			wg.Add(1)
			go func(addr string) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(s.ctx, keyCountsEvery*5)
				defer cancel()
				if err := postJSON(ctx, s.cl.client, addr, "/key-counts", data, nil); err != nil {
					s.logger.Debug("share the keys' counts", "server", addr, "error", err)
				}
			}(addr)
		}
		wg.Wait()
	}
}

// serveKeyCounts takes another server's counts (POST /key-counts on the
// server-to-server listener).
func (s *Server) serveKeyCounts(w http.ResponseWriter, r *http.Request) {
	var rep keyCountsReport
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&rep); err != nil || rep.Server == "" {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "a key counts report names its server"))
		return
	}
	s.mu.Lock()
	k := s.keys
	s.mu.Unlock()
	if k != nil {
		k.ObservePeer(rep.Server, rep.Counts)
	}
	w.WriteHeader(http.StatusNoContent)
}

// peerAnswers asks every other server for a management path (GET, with
// the server's own credentials on the server-to-server listener) and
// returns each answer decoded by decode, and the servers that did not
// answer. A request another server relayed (headerForwarded) asks nobody.
func (s *Server) peerAnswers(r *http.Request, path string, decode func(server string, body []byte) error) (asked, missing []string) {
	if r.Header.Get(headerForwarded) != "" {
		return nil, nil
	}
	st := s.cl.node.Stats()
	ctx, cancel := context.WithTimeout(r.Context(), fanOutTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range st.Servers {
		if m.ID == s.cl.name {
			continue
		}
		wg.Add(1)
		go func(id, addr string) {
			defer wg.Done()
			var raw json.RawMessage
			err := getJSON(ctx, s.cl.client, addr, path, &raw)
			if err == nil {
				err = decode(id, raw)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.logger.Debug("ask a server", "server", id, "path", path, "error", err)
				missing = append(missing, id)
				return
			}
			asked = append(asked, id)
		}(m.ID, m.Address)
	}
	wg.Wait()
	sort.Strings(asked)
	sort.Strings(missing)
	return asked, missing
}

// PeerUsage returns the other servers' usage rows for the same query
// (api.Backend.PeerUsage): each server counts the requests it took.
func (s *Server) PeerUsage(r *http.Request) (rows []wire.UsageRow, servers, missing []string) {
	var mu sync.Mutex
	path := wire.Prefix + "/usage?" + r.URL.Query().Encode()
	asked, missing := s.peerAnswers(r, path, func(_ string, body []byte) error {
		var u wire.UsageResponse
		if err := json.Unmarshal(body, &u); err != nil {
			return err
		}
		mu.Lock()
		rows = append(rows, u.Rows...)
		mu.Unlock()
		return nil
	})
	return rows, append(asked, s.cl.name), missing
}

// PeerKeyUses returns when the other servers first and last
// authenticated each key (api.Backend.PeerKeyUses), by key name.
func (s *Server) PeerKeyUses(r *http.Request) map[string][2]time.Time {
	out := map[string][2]time.Time{}
	var mu sync.Mutex
	s.peerAnswers(r, wire.Prefix+"/api-keys", func(_ string, body []byte) error {
		var l wire.APIKeyList
		if err := json.Unmarshal(body, &l); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, k := range l.Keys {
			cur := out[k.Name]
			if !k.FirstUsedAt.IsZero() && (cur[0].IsZero() || k.FirstUsedAt.Before(cur[0])) {
				cur[0] = k.FirstUsedAt
			}
			if k.LastUsedAt.After(cur[1]) {
				cur[1] = k.LastUsedAt
			}
			out[k.Name] = cur
		}
		return nil
	})
	return out
}
