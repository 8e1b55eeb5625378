// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package apikeys keeps the inference API's named keys: each a random
// 256-bit secret with a short public identifier in it (so a presented key
// finds its record without comparing every digest), stored only as a
// digest; the models it may use (names and globs); its limits (requests
// and tokens per minute, requests at once, a monthly token budget); and
// its weight in a contended model's waiting line. The role's own key (the
// credentials file's api_key) is the key named "default", allowed every
// model, until an operator revokes it.
//
// Authentication reads an immutable snapshot of the keys (one atomic
// load, then a map lookup and one constant-time comparison); a change
// (create, update, revoke, here or, in a fleet, on another server and
// replicated) builds a new snapshot. IMPORTANT: a key's secret is never
// logged, never put in an event, a status or an argument: it exists in
// clear only in the answer that creates it.
package apikeys

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/structs"
)

// Event kinds the keeper records.
const (
	EventCreated   = "api_key_created"
	EventUpdated   = "api_key_updated"
	EventRevoked   = "api_key_revoked"
	EventFirstUsed = "api_key_first_used"
	EventExpired   = "api_key_expired"
	EventLimited   = "api_key_limited"
)

// Defaults of Config.
const (
	// DefaultFlushInterval is how often the keeper writes its record of
	// the keys' use and its events of refusals.
	DefaultFlushInterval = 10 * time.Second
	// DefaultLimitedEvery is how often refusals are summed into one
	// api_key_limited event per key.
	DefaultLimitedEvery = time.Minute
)

// Backend holds the key records: the role's store, or a fleet's
// replicated state.
type Backend interface {
	// Keys returns every record.
	Keys() ([]structs.APIKey, error)
	// CreateKey writes a new record; api_key_exists when the name is
	// taken.
	CreateKey(k *structs.APIKey) error
	// UpdateKey replaces the record of k.Name; not_found without one.
	UpdateKey(k *structs.APIKey) error
	// RevokeKey removes a record; not_found without one.
	RevokeKey(name string) error
}

// Journal is where the keeper writes what it keeps beside the records:
// events and this role's record of each key's use (the role's store).
type Journal interface {
	AppendEvent(e *structs.Event) (uint64, error)
	KeyUses() (map[string]structs.KeyUse, error)
	PutKeyUses(uses map[string]structs.KeyUse) error
}

// Recorder counts what requests used (core/usage): each request once it
// settled, and the tokens a key used this month for its budget.
type Recorder interface {
	Record(key string, u structs.RequestUsage)
	MonthTokens(key string, now time.Time) int64
}

// Config configures a Keeper.
type Config struct {
	Backend Backend
	// Journal receives events and the keys' use (nil: none kept).
	Journal Journal
	// Usage counts requests (nil: none counted, no monthly budgets).
	Usage Recorder
	// RoleKey returns the role's own key, the secret of the key named
	// default.
	RoleKey func() string
	// FlushInterval and LimitedEvery: see the defaults.
	FlushInterval time.Duration
	LimitedEvery  time.Duration
	Now           func() time.Time
	Logger        hclog.Logger
}

// entry is one key of a snapshot.
type entry struct {
	rec    structs.APIKey
	digest [32]byte
	scope  *Scope
}

// keySet is an immutable snapshot of the keys.
type keySet struct {
	byID   map[string]*entry
	byName map[string]*entry
	byUse  map[string]*entry
	role   *entry
}

// useState is this role's record of one key's use.
type useState struct {
	name  string
	first time.Time
	last  atomic.Int64 // Unix nanoseconds
	// announced says the first use had its event (or was read from the
	// journal); expired that the expiry had its. Both are the loop's.
	announced bool
	expired   bool
	// written is the last use the journal holds, and whether it holds the
	// expiry (the loop's): an unchanged use is not written again.
	written        int64
	writtenExpired bool
}

// Keeper keeps the keys: the snapshot authentication reads, the mutations,
// the per-key limits and the record of their use.
type Keeper struct {
	cfg    Config
	logger hclog.Logger
	snap   atomic.Pointer[keySet]

	// mu serialises mutations and reloads, so that a snapshot is never
	// replaced by an older one.
	mu sync.Mutex

	states sync.Map // use ID -> *keyState
	uses   sync.Map // use ID -> *useState
	// peers are the other servers of a cluster this keeper heard from,
	// and when last (ObservePeer, ForgetPeers).
	peersMu sync.Mutex
	peers   map[string]time.Time
	// changed is closed and replaced when a snapshot is published.
	changedMu sync.Mutex
	changed   chan struct{}
	firstUse  chan string // use IDs whose first use waits for its event

	stop chan struct{}
	done chan struct{}
}

// New loads the keys and returns a Keeper; Start runs its loop.
func New(cfg Config) (*Keeper, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.RoleKey == nil {
		cfg.RoleKey = func() string { return "" }
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.LimitedEvery <= 0 {
		cfg.LimitedEvery = DefaultLimitedEvery
	}
	k := &Keeper{cfg: cfg, logger: cfg.Logger.Named("api_keys"), changed: make(chan struct{}),
		firstUse: make(chan string, 256), stop: make(chan struct{}), done: make(chan struct{})}
	if cfg.Journal != nil {
		uses, err := cfg.Journal.KeyUses()
		if err != nil {
			return nil, structs.Wrap(structs.CodeInternal, err, "read the API keys' use")
		}
		for id, u := range uses {
			s := &useState{name: u.Name, first: u.FirstUsedAt, announced: true, expired: !u.ExpiredAt.IsZero()}
			if !u.LastUsedAt.IsZero() {
				s.last.Store(u.LastUsedAt.UnixNano())
			}
			s.written, s.writtenExpired = s.last.Load(), s.expired
			k.uses.Store(id, s)
		}
	}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the records again and publishes a new snapshot (the
// backend changed: a fleet applied a replicated change).
func (k *Keeper) Reload() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reloadLocked()
}

func (k *Keeper) reloadLocked() error {
	recs, err := k.cfg.Backend.Keys()
	if err != nil {
		return structs.Wrap(structs.CodeInternal, err, "read the API keys")
	}
	set := &keySet{byID: map[string]*entry{}, byName: map[string]*entry{}, byUse: map[string]*entry{}}
	live := map[string]bool{}
	for i := range recs {
		e := &entry{rec: recs[i]}
		sc, err := NewScope(e.rec.Models)
		if err != nil {
			k.logger.Warn("an API key's models do not compile: it allows none until updated", "key", e.rec.Name, "error", err)
			sc = &Scope{}
		}
		e.scope = sc
		switch {
		case e.rec.Role:
			set.role = e
		default:
			d, ok := digestBytes(e.rec.Digest)
			if !ok || e.rec.ID == "" {
				k.logger.Warn("an API key's record has no usable digest: it authenticates nothing", "key", e.rec.Name)
				continue
			}
			e.digest = d
			set.byID[e.rec.ID] = e
		}
		set.byName[e.rec.Name] = e
		set.byUse[e.rec.UseID()] = e
		live[e.rec.UseID()] = true
	}
	k.snap.Store(set)
	// A revoked key's counters and record of use go with it.
	for _, m := range []*sync.Map{&k.states, &k.uses} {
		m.Range(func(id, _ any) bool {
			if !live[id.(string)] {
				m.Delete(id)
			}
			return true
		})
	}
	k.changedMu.Lock()
	close(k.changed)
	k.changed = make(chan struct{})
	k.changedMu.Unlock()
	return nil
}

// Changed returns a channel closed at the next published snapshot: take
// it, read, then wait on it.
func (k *Keeper) Changed() <-chan struct{} {
	k.changedMu.Lock()
	defer k.changedMu.Unlock()
	return k.changed
}

// Principal is who an authenticated request is: its key's record (a copy
// of the snapshot's, never changed) and scope.
type Principal struct {
	Key   *structs.APIKey
	Scope *Scope
	k     *Keeper
}

// Authenticate finds the key presented (Authorization: Bearer or
// x-api-key) and checks it: unauthorized when no key matches or the key
// expired. IMPORTANT: one constant-time comparison, against the record the
// public identifier names (or the role's key); the message never echoes
// what was presented.
func (k *Keeper) Authenticate(presented string) (*Principal, error) {
	set := k.snap.Load()
	var e *entry
	if id, ok := idOf(presented); ok {
		if c := set.byID[id]; c != nil && matches(presented, c.digest) {
			e = c
		}
	} else if set.role != nil && secretEqual(presented, k.cfg.RoleKey()) {
		e = set.role
	}
	if e == nil {
		return nil, structs.Errf(structs.CodeUnauthorized, "missing or wrong API key (send Authorization: Bearer <key>, or x-api-key: <key>)")
	}
	now := k.cfg.Now()
	if e.rec.Expired(now) {
		return nil, structs.Errf(structs.CodeUnauthorized, "the API key %q expired at %s", e.rec.Name, e.rec.ExpiresAt.UTC().Format(time.RFC3339))
	}
	k.noteUse(&e.rec, now)
	return &Principal{Key: &e.rec, Scope: e.scope, k: k}, nil
}

// noteUse records a use (one atomic store after the first).
func (k *Keeper) noteUse(rec *structs.APIKey, now time.Time) {
	id := rec.UseID()
	if v, ok := k.uses.Load(id); ok {
		v.(*useState).last.Store(now.UnixNano())
		return
	}
	s := &useState{name: rec.Name, first: now}
	s.last.Store(now.UnixNano())
	if _, loaded := k.uses.LoadOrStore(id, s); loaded {
		return
	}
	select {
	case k.firstUse <- id:
	default: // the loop is behind: the flush still writes the use
	}
}

// state returns a key's counters on this role.
func (k *Keeper) state(rec *structs.APIKey) *keyState {
	id := rec.UseID()
	if v, ok := k.states.Load(id); ok {
		return v.(*keyState)
	}
	v, _ := k.states.LoadOrStore(id, &keyState{})
	return v.(*keyState)
}

// Admit takes a request's share of the principal's limits: a Ticket the
// request ends exactly once (Ticket.Settle, or Ticket.EndUntaken when
// nothing took it over), or a refusal (rate_limited, quota_exceeded) that
// also counted in the key's usage. hdr receives the rate-limit headers
// either way.
func (p *Principal) Admit(hdr *RateHeaders) (*Ticket, error) {
	k := p.k
	now := k.cfg.Now()
	t := &Ticket{k: k, key: p.Key, start: now}
	lim := p.Key.Limits
	if !lim.Any() {
		return t, nil
	}
	var month int64
	if lim.MonthlyTokens > 0 && k.cfg.Usage != nil {
		month = k.cfg.Usage.MonthTokens(p.Key.Name, now)
	}
	st := k.state(p.Key)
	if err := st.admit(lim, now, month, hdr); err != nil {
		if k.cfg.Usage != nil {
			k.cfg.Usage.Record(p.Key.Name, structs.RequestUsage{Code: string(err.Code)})
		}
		return nil, err
	}
	t.st = st
	return t, nil
}

// Ticket is one admitted request's share of its key's limits.
type Ticket struct {
	k     *Keeper
	key   *structs.APIKey
	st    *keyState // nil: the key has no limits
	start time.Time
	taken atomic.Bool
	done  atomic.Bool
}

// Take says the router took the request over: it settles it when the
// request ends, which may be after the handler returned (a stream).
func (t *Ticket) Take() { t.taken.Store(true) }

// Settle ends the request: its place comes back, its tokens are debited
// and its usage counted. A second call does nothing.
func (t *Ticket) Settle(u structs.RequestUsage) {
	if t == nil || t.done.Swap(true) {
		return
	}
	now := t.k.cfg.Now()
	if t.st != nil {
		var tokens int64
		if u.UsageKnown {
			tokens = u.PromptTokens + u.CompletionTokens
		}
		t.st.settle(t.key.Limits, now, tokens)
	}
	if t.k.cfg.Usage != nil && (u.Model != "" || u.Code != "") {
		t.k.cfg.Usage.Record(t.key.Name, u)
	}
}

// EndUntaken ends a request nothing took over (a route outside the router:
// GET /v1/models, a stored response), when its handler returned.
func (t *Ticket) EndUntaken() {
	if t != nil && !t.taken.Load() {
		t.Settle(structs.RequestUsage{})
	}
}

// Start runs the keeper's loop: first-use events at once, the record of
// use and the refusal events every interval, expiries as they pass.
func (k *Keeper) Start() { go k.run() }

// Close stops the loop, writing what it holds; Start must have run.
func (k *Keeper) Close() {
	select {
	case <-k.stop:
		return
	default:
	}
	close(k.stop)
	<-k.done
}

func (k *Keeper) run() {
	defer close(k.done)
	flush := time.NewTicker(k.cfg.FlushInterval)
	defer flush.Stop()
	limited := time.NewTicker(k.cfg.LimitedEvery)
	defer limited.Stop()
	k.checkExpiries()
	for {
		select {
		case <-k.stop:
			k.drainFirstUse()
			k.emitLimited()
			k.flushUses()
			return
		case <-k.firstUse:
			k.drainFirstUse()
			k.flushUses()
		case <-flush.C:
			k.flushUses()
			k.checkExpiries()
		case <-limited.C:
			k.emitLimited()
		}
	}
}

// drainFirstUse empties the first-use signal (flushUses announces them).
func (k *Keeper) drainFirstUse() {
	for {
		select {
		case <-k.firstUse:
		default:
			return
		}
	}
}

// event appends an event; a journal that refuses is logged, never fatal.
func (k *Keeper) event(kind string, payload map[string]any) {
	if k.cfg.Journal == nil {
		return
	}
	if _, err := k.cfg.Journal.AppendEvent(&structs.Event{At: k.cfg.Now().UTC(), Kind: kind, Payload: payload}); err != nil {
		k.logger.Warn("record an API key event", "kind", kind, "error", err)
	}
}

// flushUses announces the first uses not announced yet, then writes the
// record of use (a use in the journal had its event).
func (k *Keeper) flushUses() {
	if k.cfg.Journal == nil {
		return
	}
	out := map[string]structs.KeyUse{}
	type mark struct {
		u    *useState
		last int64
	}
	var written []mark
	k.uses.Range(func(id, v any) bool {
		u := v.(*useState)
		if (u.first.IsZero() && !u.expired) || (u.written == u.last.Load() && u.writtenExpired == u.expired) {
			return true
		}
		if !u.first.IsZero() && !u.announced {
			u.announced = true
			k.event(EventFirstUsed, map[string]any{"key": u.name, "at": u.first.UTC()})
		}
		rec := structs.KeyUse{Name: u.name, FirstUsedAt: u.first.UTC()}
		last := u.last.Load()
		if last > 0 {
			rec.LastUsedAt = time.Unix(0, last).UTC()
		}
		if u.expired {
			rec.ExpiredAt = rec.LastUsedAt
			if rec.ExpiredAt.IsZero() {
				rec.ExpiredAt = k.cfg.Now().UTC()
			}
		}
		out[id.(string)] = rec
		written = append(written, mark{u, last})
		return true
	})
	if len(out) == 0 {
		return
	}
	if err := k.cfg.Journal.PutKeyUses(out); err != nil {
		k.logger.Warn("record the API keys' use", "error", err)
		return
	}
	for _, m := range written {
		m.u.written, m.u.writtenExpired = m.last, m.u.expired
	}
}

// checkExpiries announces each key whose expiry passed, once.
func (k *Keeper) checkExpiries() {
	now := k.cfg.Now()
	set := k.snap.Load()
	for _, e := range set.byName {
		if !e.rec.Expired(now) {
			continue
		}
		id := e.rec.UseID()
		v, _ := k.uses.LoadOrStore(id, &useState{name: e.rec.Name})
		u := v.(*useState)
		if u.expired {
			continue
		}
		u.expired = true
		k.event(EventExpired, map[string]any{"key": e.rec.Name, "expired_at": e.rec.ExpiresAt.UTC()})
		k.flushUses()
	}
}

// emitLimited writes one event per key refused since the last, with the
// counts by limit.
func (k *Keeper) emitLimited() {
	set := k.snap.Load()
	names := map[string]string{}
	for _, e := range set.byName {
		names[e.rec.UseID()] = e.rec.Name
	}
	k.states.Range(func(id, v any) bool {
		counts := v.(*keyState).takeRefused()
		if len(counts) == 0 {
			return true
		}
		var total int64
		for _, n := range counts {
			total += n
		}
		k.event(EventLimited, map[string]any{"key": names[id.(string)], "refused": counts, "total": total})
		return true
	})
}

// Counts returns this server's use of each key with limits, by use ID,
// for the other servers of a cluster: every such key, used here or not,
// so that they hold a baseline before its first request.
func (k *Keeper) Counts() map[string]Counts {
	now := k.cfg.Now()
	month := now.UTC().Format("2006-01")
	out := map[string]Counts{}
	for id, e := range k.snap.Load().byUse {
		if !e.rec.Limits.Any() {
			continue
		}
		c := Counts{Month: month}
		if v, ok := k.states.Load(id); ok {
			st := v.(*keyState)
			st.mu.Lock()
			c.Requests, c.Tokens, c.InFlight = st.admitted, st.used, st.inFlight
			c.RecentRequests, c.RecentTokens = st.lastMinute(now)
			st.mu.Unlock()
		}
		if k.cfg.Usage != nil {
			c.MonthTokens = k.cfg.Usage.MonthTokens(e.rec.Name, now)
		}
		out[id] = c
	}
	return out
}

// ObservePeer takes another server's counts (by use ID): its requests and
// tokens since its last report count against this server's buckets, its
// requests running and its month's tokens against the concurrency and the
// budget, until it reports again. Keys unknown here are ignored (revoked,
// or not replicated here yet).
func (k *Keeper) ObservePeer(peer string, counts map[string]Counts) {
	now := k.cfg.Now()
	k.peersMu.Lock()
	if k.peers == nil {
		k.peers = map[string]time.Time{}
	}
	_, known := k.peers[peer]
	k.peers[peer] = now
	k.peersMu.Unlock()
	set := k.snap.Load()
	for id, c := range counts {
		e := set.byUse[id]
		if e == nil || !e.rec.Limits.Any() {
			continue
		}
		k.state(&e.rec).observe(e.rec.Limits, peer, c, now, !known)
	}
}

// ForgetPeers drops what the servers not in live said (a server removed
// from the cluster, or silent for longer than stale): their requests in
// flight and month's tokens count no more.
func (k *Keeper) ForgetPeers(live map[string]bool, stale time.Duration) {
	now := k.cfg.Now()
	k.peersMu.Lock()
	for p, at := range k.peers {
		if !live[p] || now.Sub(at) > stale {
			delete(k.peers, p)
		}
	}
	k.peersMu.Unlock()
	k.states.Range(func(_, v any) bool {
		st := v.(*keyState)
		st.mu.Lock()
		for p, c := range st.peers {
			if !live[p] || now.Sub(c.At) > stale {
				delete(st.peers, p)
			}
		}
		st.mu.Unlock()
		return true
	})
}

// View is a key as the management API shows it, with this role's record
// of its use and, for a key with limits, where it stands against them.
type View struct {
	Key         structs.APIKey
	FirstUsedAt time.Time
	LastUsedAt  time.Time
	Standing    *Standing
}

// List returns every key, by name.
func (k *Keeper) List() []View {
	set := k.snap.Load()
	out := make([]View, 0, len(set.byName))
	for _, e := range set.byName {
		v := View{Key: e.rec}
		if e.rec.Limits.Any() {
			now := k.cfg.Now()
			var month int64
			if k.cfg.Usage != nil {
				month = k.cfg.Usage.MonthTokens(e.rec.Name, now)
			}
			st := k.state(&e.rec).standing(e.rec.Limits, now, month)
			v.Standing = &st
		}
		if u, ok := k.uses.Load(e.rec.UseID()); ok {
			us := u.(*useState)
			v.FirstUsedAt = us.first
			if last := us.last.Load(); last > 0 {
				v.LastUsedAt = time.Unix(0, last).UTC()
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.Name < out[j].Key.Name })
	return out
}

// Get returns one key, or not_found.
func (k *Keeper) Get(name string) (View, error) {
	for _, v := range k.List() {
		if v.Key.Name == name {
			return v, nil
		}
	}
	return View{}, structs.Errf(structs.CodeNotFound, "no API key named %q (capyctl list api-keys lists them)", name)
}
