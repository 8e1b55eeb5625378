// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Keys of the state in the store's fleet_state bucket.
const (
	keyApplied      = "meta/applied"
	keyCluster      = "meta/cluster"
	prefixHost      = "host/"
	prefixPlacement = "placement/"
)

// Log commits encoded commands (raftlog.Node).
type Log interface {
	// Propose commits data and returns, once this server applied it, the
	// apply's Result and the entry's index in the log.
	Propose(data []byte) (Result, uint64, error)
}

// Result is what applying one command gave: a value, or the command's
// refusal (the same on every server, since the state and the entry are).
type Result struct {
	Value any
	Err   error
}

// State is the replicated state machine of one server. Reads are from
// memory; ApplyEntry writes a committed command's change and the entry's
// index in one transaction of the role's store, then updates memory and
// wakes the waiters on Changed.
type State struct {
	st     *store.Store
	logger hclog.Logger

	mu         sync.RWMutex
	applied    uint64
	cluster    *ClusterRecord
	hosts      map[string]HostRecord
	placements map[string]*Placement
	engines    map[string]EngineRecord
	trust      trust
	keys       keys
	// routes maps each model name to its deployment (rebuilt on every
	// placement change).
	routes map[string]string
	log    Log

	sigMu   sync.Mutex
	changed chan struct{}

	haltOnce sync.Once
	halted   chan struct{}
	haltErr  error
}

// Open loads the state the store holds.
func Open(st *store.Store, logger hclog.Logger) (*State, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &State{st: st, logger: logger.Named("fsm"), hosts: map[string]HostRecord{}, placements: map[string]*Placement{},
		engines: map[string]EngineRecord{}, trust: newTrust(), keys: newKeys(), routes: map[string]string{}, halted: make(chan struct{})}
	raw, err := st.FleetStateList("")
	if err != nil {
		return nil, err
	}
	for k, v := range raw {
		if err := s.load(k, v); err != nil {
			return nil, fmt.Errorf("server state %s: %w", k, err)
		}
	}
	s.rebuildRoutes()
	return s, nil
}

// load takes one stored key into memory.
func (s *State) load(k string, v json.RawMessage) error {
	switch {
	case k == keyApplied:
		return json.Unmarshal(v, &s.applied)
	case k == keyCluster:
		s.cluster = &ClusterRecord{}
		return json.Unmarshal(v, s.cluster)
	case strings.HasPrefix(k, prefixHost):
		var h HostRecord
		if err := json.Unmarshal(v, &h); err != nil {
			return err
		}
		s.hosts[h.Name] = h
	case strings.HasPrefix(k, prefixPlacement):
		var p Placement
		if err := json.Unmarshal(v, &p); err != nil {
			return err
		}
		s.placements[p.Deployment] = &p
	case strings.HasPrefix(k, prefixEngine):
		var e EngineRecord
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		s.engines[e.Name] = e
	default:
		if ok, err := s.keys.load(k, v); ok {
			return err
		}
		return s.trust.load(k, v)
	}
	return nil
}

// ResetApplied records that no entry of the log was applied yet: a server
// that starts a new log (its first start with raft, or its raft directory
// gone) keeps the state its store holds, and applies the new log's
// entries from the first (their indexes start again at 1).
func (s *State) ResetApplied() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.st.UpdateFleet(func(fs *store.FleetState) error { return fs.Put(keyApplied, uint64(0)) }); err != nil {
		return structs.Wrap(structs.CodeStoreUnavailable, err, "reset the applied index")
	}
	s.applied = 0
	return nil
}

// SetLog routes Apply through l (raft); nil: Apply refuses.
func (s *State) SetLog(l Log) {
	s.mu.Lock()
	s.log = l
	s.mu.Unlock()
}

// Apply commits one command through the log and returns its value once
// this server applied it, with the index of its entry.
func (s *State) Apply(c Command) (any, uint64, error) {
	data, err := Encode(c, time.Now())
	if err != nil {
		return nil, 0, err
	}
	s.mu.RLock()
	log := s.log
	s.mu.RUnlock()
	if log == nil {
		return nil, 0, structs.Errf(structs.CodeShuttingDown, "the server's replicated log is not open")
	}
	res, idx, err := log.Propose(data)
	if err != nil {
		return nil, idx, err
	}
	return res.Value, idx, res.Err
}

// ApplyEntry applies one committed entry of the log (raft's FSM). An
// entry at or below the applied index is a replay and changes nothing. A
// command this server cannot read halts the state unless its writer
// flagged it ignorable; so does a store that refuses the write, since
// the state would lack a committed command (the entry is applied again
// after a restart: its index was not recorded).
func (s *State) ApplyEntry(index uint64, data []byte) Result {
	if err := s.HaltErr(); err != nil {
		return Result{Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.applied {
		return Result{}
	}
	env, c, err := Decode(data)
	var unknown *UnknownCommandError
	switch {
	case errors.As(err, &unknown) && env.Ignorable:
		s.logger.Warn("skipped a command of a newer release this server does not know (it is flagged ignorable)",
			"type", env.Op, "version", env.V, "index", index)
		return s.recordOnly(index, Result{})
	case errors.As(err, &unknown):
		unknown.Index = index
		return s.haltLocked(unknown)
	case err != nil:
		return s.haltLocked(fmt.Errorf("entry %d of the replicated log: %w", index, err))
	}
	var after func()
	var value any
	werr := s.st.UpdateFleet(func(fs *store.FleetState) error {
		var err error
		after, value, err = s.apply(fs, c, env.At)
		if err != nil {
			return err
		}
		return fs.Put(keyApplied, index)
	})
	var refusal *structs.Error
	switch {
	case werr == nil:
		after()
		s.applied = index
		s.publish()
		return Result{Value: value}
	case errors.As(werr, &refusal) && refusal.Code != structs.CodeStoreUnavailable:
		// A refusal is the same on every server: the entry is consumed.
		return s.recordOnly(index, Result{Err: refusal})
	}
	return s.haltLocked(structs.Wrap(structs.CodeStoreUnavailable, werr, "apply entry %d (%s) to this server's store", index, env.Op))
}

// recordOnly records index as applied without a change; the caller holds
// mu.
func (s *State) recordOnly(index uint64, r Result) Result {
	if err := s.st.UpdateFleet(func(fs *store.FleetState) error { return fs.Put(keyApplied, index) }); err != nil {
		return s.haltLocked(structs.Wrap(structs.CodeStoreUnavailable, err, "record entry %d as applied", index))
	}
	s.applied = index
	s.publish()
	return r
}

// haltLocked stops applying for good: the first reason stays.
func (s *State) haltLocked(err error) Result {
	s.haltOnce.Do(func() {
		s.haltErr = err
		s.logger.Error("this server stops applying the replicated log", "error", err)
		close(s.halted)
	})
	return Result{Err: s.haltErr}
}

// Halted is closed once the state stopped applying the log (HaltErr
// says why): the server must stop rather than serve a state that lacks
// a committed command.
func (s *State) Halted() <-chan struct{} { return s.halted }

// HaltErr is why the state halted; nil while it applies.
func (s *State) HaltErr() error {
	select {
	case <-s.halted:
		return s.haltErr
	default:
		return nil
	}
}

// Applied is the index of the last entry applied.
func (s *State) Applied() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.applied
}

// Changed returns a channel closed at the next change of the state. A
// waiter takes the channel before it reads, so that a change between the
// two is never missed.
func (s *State) Changed() <-chan struct{} {
	s.sigMu.Lock()
	defer s.sigMu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// publish wakes the waiters on Changed.
func (s *State) publish() {
	s.sigMu.Lock()
	ch := s.changed
	s.changed = nil
	s.sigMu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// WaitApplied waits until the entry at index is applied here, or ctx
// ends.
func (s *State) WaitApplied(ctx context.Context, index uint64) error {
	for {
		ch := s.Changed()
		if s.Applied() >= index {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// apply validates c against memory, writes its change and returns the
// memory update to run once the transaction committed; the caller holds
// mu.
func (s *State) apply(fs *store.FleetState, c Command, at time.Time) (func(), any, error) {
	switch c := c.(type) {
	case HostJoined:
		h, ok := s.hosts[c.Host]
		if !ok {
			h = HostRecord{Name: c.Host, JoinedAt: at}
		}
		return func() { s.hosts[c.Host] = h }, nil, fs.Put(prefixHost+c.Host, h)
	case HostDrain:
		h, ok := s.hosts[c.Host]
		if !ok {
			return nil, nil, structs.Errf(structs.CodeNotFound, "no host %s", c.Host)
		}
		h.Drained = c.Drain
		return func() { s.hosts[c.Host] = h }, nil, fs.Put(prefixHost+c.Host, h)
	case HostRemoved:
		return s.applyHostRemoved(fs, c, at)
	case Placed:
		return s.applyPlaced(fs, c)
	case Unplaced:
		return func() { delete(s.placements, c.Deployment); s.rebuildRoutes() }, nil, fs.Delete(prefixPlacement + c.Deployment)
	case Restored:
		return s.applyRestored(fs, c)
	case ClusterConfigured:
		// The expected size only grows: two servers' joins committed in
		// either order leave the larger (a leader's count read before the
		// other join applied cannot lower it).
		rec := &ClusterRecord{Expect: c.Expect}
		if s.cluster != nil && s.cluster.Expect > rec.Expect {
			rec.Expect = s.cluster.Expect
		}
		return func() { s.cluster = rec }, nil, fs.Put(keyCluster, rec)
	case TokenCreated:
		return s.applyTokenCreated(fs, c, at)
	case TokenRedeemed:
		return s.applyTokenRedeemed(fs, c, at)
	case ServerRemoved:
		return s.applyServerRemoved(fs, c, at)
	case ServerAdmitted:
		return s.applyServerAdmitted(fs, c)
	case EngineRegistered:
		return s.applyEngineRegistered(fs, c, at)
	case EngineRemoved:
		return s.applyEngineRemoved(fs, c)
	case KeyCreated:
		return s.applyKeyCreated(fs, c)
	case KeyUpdated:
		return s.applyKeyUpdated(fs, c)
	case KeyRevoked:
		return s.applyKeyRevoked(fs, c)
	}
	if _, extra := extraTypes()[c.CommandType()]; extra {
		return func() {}, nil, nil // a build's own types change nothing here
	}
	return nil, nil, structs.Errf(structs.CodeInternal, "command %s has no apply", c.CommandType())
}

// applyHostRemoved forgets a host and revokes its certificates, in one
// change: every server refuses it from then on.
func (s *State) applyHostRemoved(fs *store.FleetState, c HostRemoved, at time.Time) (func(), any, error) {
	for _, p := range s.placements {
		for _, hs := range p.Hosts {
			if hs.Host == c.Host {
				return nil, nil, structs.Errf(structs.CodeConflict, "host %s runs part of deployment %s: delete it first", c.Host, p.Deployment).
					WithDetail("deployment", p.Deployment)
			}
		}
	}
	if _, ok := s.hosts[c.Host]; !ok {
		return nil, nil, structs.Errf(structs.CodeNotFound, "no host %s", c.Host)
	}
	revoke, err := s.revokeHost(fs, c.Host, at)
	if err != nil {
		return nil, nil, err
	}
	return func() { delete(s.hosts, c.Host); revoke() }, nil, fs.Delete(prefixHost + c.Host)
}

func (s *State) applyPlaced(fs *store.FleetState, c Placed) (func(), any, error) {
	if c.Placement == nil || c.Placement.Deployment == "" {
		return nil, nil, structs.Errf(structs.CodeInvalidRequest, "a placement names its deployment")
	}
	p := c.Placement.clone()
	cur, exists := s.placements[p.Deployment]
	if c.Checked {
		have := uint64(0)
		if exists {
			have = cur.Version
		}
		if have != c.Expect {
			return nil, nil, structs.Errf(structs.CodeConflict, "deployment %s changed meanwhile (version %d, not %d): try again", p.Deployment, have, c.Expect).
				WithDetail("version", have)
		}
	}
	p.Version = 1
	if exists {
		p.Version = cur.Version + 1
	}
	for _, hs := range p.Hosts {
		if _, ok := s.hosts[hs.Host]; !ok {
			return nil, nil, structs.Errf(structs.CodeNotFound, "deployment %s names host %s, which is not a member", p.Deployment, hs.Host)
		}
	}
	if err := s.routesFreeLocked(p.Deployment, p.Routes); err != nil {
		return nil, nil, err
	}
	return func() { s.placements[p.Deployment] = p; s.rebuildRoutes() }, p.Version, fs.Put(prefixPlacement+p.Deployment, p)
}

// Cluster returns the cluster's own record (nil before the first server
// wrote it).
func (s *State) Cluster() *ClusterRecord {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.cluster == nil {
		return nil
	}
	c := *s.cluster
	return &c
}

// Host returns a host's record.
func (s *State) Host(name string) (HostRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.hosts[name]
	return h, ok
}

// Hosts returns every host's record, by name.
func (s *State) Hosts() []HostRecord {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hostsLocked()
}

func (s *State) hostsLocked() []HostRecord {
	out := make([]HostRecord, 0, len(s.hosts))
	for _, h := range s.hosts {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Placement returns a deployment's placement (a copy).
func (s *State) Placement(dep string) (*Placement, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.placements[dep]
	if !ok {
		return nil, false
	}
	return p.clone(), true
}

// Placements returns every placement (copies), by deployment name.
func (s *State) Placements() []*Placement {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.placementsLocked()
}

func (s *State) placementsLocked() []*Placement {
	out := make([]*Placement, 0, len(s.placements))
	for _, p := range s.placements {
		out = append(out, p.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Deployment < out[j].Deployment })
	return out
}

// PlacementsOn returns the placements with a share on host, as
// Placements does (copies, by name): each host's link reads its share at
// every change of the state, and copying every placement for every host
// made a change cost hosts × placements copies.
func (s *State) PlacementsOn(host string) []*Placement {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*Placement
	for _, p := range s.placements {
		for _, hs := range p.Hosts {
			if hs.Host == host {
				out = append(out, p.clone())
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Deployment < out[j].Deployment })
	return out
}

// Empty reports whether the state holds no host and no placement.
func (s *State) Empty() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.hosts) == 0 && len(s.placements) == 0 && len(s.engines) == 0
}

// RoutesFree refuses a deployment whose name or routes another placed
// deployment answers already (conflict), as a standalone role does.
func (s *State) RoutesFree(dep string, routes []string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.routesFreeLocked(dep, routes)
}

func (s *State) routesFreeLocked(dep string, routes []string) error {
	for _, r := range append([]string{dep}, routes...) {
		if owner, ok := s.routes[r]; ok && owner != dep {
			return structs.Errf(structs.CodeConflict, "route %q is already served by deployment %q", r, owner).
				WithDetail("route", r).WithDetail("deployment", owner)
		}
	}
	return nil
}

// rebuildRoutes rebuilds the model name index; the caller holds mu. A
// deployment's own name answers first, then its routes; deployments are
// taken by name, so the index never depends on map order.
func (s *State) rebuildRoutes() {
	routes := make(map[string]string, len(s.placements)*2)
	names := make([]string, 0, len(s.placements))
	for name := range s.placements {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, r := range s.placements[name].Routes {
			if _, taken := routes[r]; !taken {
				routes[r] = name
			}
		}
	}
	for name := range s.placements {
		routes[name] = name
	}
	s.routes = routes
}

// RouteOwner returns the placement that answers a model name (shared:
// callers must not change it).
func (s *State) RouteOwner(model string) (*Placement, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	dep, ok := s.routes[model]
	if !ok {
		return nil, false
	}
	p, ok := s.placements[dep]
	return p, ok
}
