// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Command ops: every change to the server's state is one of them.
const (
	OpHostJoined  = "host_joined"
	OpHostDrain   = "host_drain"
	OpHostRemoved = "host_removed"
	OpPlaced      = "placed"
	OpUnplaced    = "unplaced"
	// OpRestored replaces the whole state with a snapshot's (capyctl
	// snapshot restore): through the log, so every server replaces its
	// own.
	OpRestored = "restored"
)

// Command is one entry of the server's log.
type Command struct {
	Op   string    `json:"op"`
	At   time.Time `json:"at"`
	Host string    `json:"host,omitempty"`
	// Drain is OpHostDrain's value.
	Drain bool `json:"drain,omitempty"`
	// Placement is OpPlaced's value; OpUnplaced names Deployment only.
	Placement  *Placement `json:"placement,omitempty"`
	Deployment string     `json:"deployment,omitempty"`
	// State is OpRestored's value: a Snapshot's encoding.
	State json.RawMessage `json:"state,omitempty"`
}

// HostRecord is the server's durable record of a joined host.
type HostRecord struct {
	Name     string    `json:"name"`
	JoinedAt time.Time `json:"joined_at"`
	Drained  bool      `json:"drained,omitempty"`
}

// Placement says which hosts run a deployment and how many instances
// each: the server's decision, kept across restarts so that the hosts'
// engines are found again, never started twice.
type Placement struct {
	Deployment string `json:"deployment"`
	// Hosts are the hosts in instance order: the deployment's instance
	// indexes run through them (host 0's instances first).
	Hosts []HostShare `json:"hosts"`
	// Routes are the model names the deployment answers.
	Routes []string `json:"routes"`
	// Endpoints are the inference endpoints its engine serves.
	Endpoints []string `json:"endpoints,omitempty"`
	// Revision is the revision the hosts run.
	Revision uint64    `json:"revision"`
	At       time.Time `json:"at"`
	// Group is set for one model across several machines: one member per
	// host of Hosts, in rank order (group.go).
	Group *GroupPlacement `json:"group,omitempty"`
}

// HostShare is one host's part of a placement.
type HostShare struct {
	Host      string `json:"host"`
	Instances int    `json:"instances"`
}

// HostNames lists the placement's hosts.
func (p *Placement) HostNames() []string {
	out := make([]string, 0, len(p.Hosts))
	for _, h := range p.Hosts {
		out = append(out, h.Host)
	}
	return out
}

// State is the server's state machine: hosts and placements, applied from
// Commands. Reads are from memory; Apply writes the command and the state
// change in one transaction, then updates memory.
type State struct {
	st *store.Store

	mu         sync.RWMutex
	hosts      map[string]HostRecord
	placements map[string]*Placement
	// routes maps each model name to its deployment (rebuilt on every
	// placement change; the scale benchmark measures it).
	routes map[string]string
	// log replicates commands (nil: this server alone).
	log Log
}

// OpenState loads the state the store holds.
func OpenState(st *store.Store) (*State, error) {
	s := &State{st: st, hosts: map[string]HostRecord{}, placements: map[string]*Placement{}, routes: map[string]string{}}
	raw, err := st.FleetStateList("")
	if err != nil {
		return nil, err
	}
	for k, v := range raw {
		switch {
		case strings.HasPrefix(k, "host/"):
			var h HostRecord
			if err := json.Unmarshal(v, &h); err != nil {
				return nil, fmt.Errorf("server state %s: %w", k, err)
			}
			s.hosts[h.Name] = h
		case strings.HasPrefix(k, "placement/"):
			var p Placement
			if err := json.Unmarshal(v, &p); err != nil {
				return nil, fmt.Errorf("server state %s: %w", k, err)
			}
			s.placements[p.Deployment] = &p
		}
	}
	s.rebuildRoutes()
	return s, nil
}

// Log replicates the server's commands before they are applied (several
// servers). Propose returns once data is committed and every replica's
// state machine applied it through ApplyEncoded; its error is the apply's
// on this server.
type Log interface {
	Propose(data []byte) error
}

// SetLog routes every command through l from now on (nil: this server's
// store alone).
func (s *State) SetLog(l Log) {
	s.mu.Lock()
	s.log = l
	s.mu.Unlock()
}

// Apply runs one command through the log and the state machine.
func (s *State) Apply(c Command) error {
	if c.At.IsZero() {
		c.At = time.Now().UTC()
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	s.mu.RLock()
	log := s.log
	s.mu.RUnlock()
	if log != nil {
		return log.Propose(data)
	}
	return s.ApplyEncoded(data)
}

// ApplyEncoded applies one encoded command (a committed log entry): the
// command and the state change are written in one store transaction, then
// memory follows. A command the state refuses (a drain of an unknown
// host) changes nothing and returns the refusal.
func (s *State) ApplyEncoded(data []byte) error {
	var c Command
	if err := json.Unmarshal(data, &c); err != nil {
		return structs.Errf(structs.CodeInternal, "a server command does not decode: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var after func()
	_, err := s.st.ApplyFleet(data, func(fs *store.FleetState) error {
		var err error
		after, err = s.apply(fs, c)
		return err
	})
	if err != nil {
		var se *structs.Error
		if errors.As(err, &se) {
			return se
		}
		return structs.Wrap(structs.CodeStoreUnavailable, err, "apply %s", c.Op)
	}
	after()
	return nil
}

// apply validates c against memory, writes its change and returns the
// memory update to run once the transaction committed.
func (s *State) apply(fs *store.FleetState, c Command) (func(), error) {
	switch c.Op {
	case OpHostJoined:
		h, ok := s.hosts[c.Host]
		if !ok {
			h = HostRecord{Name: c.Host, JoinedAt: c.At}
		}
		return func() { s.hosts[c.Host] = h }, fs.Put("host/"+c.Host, h)
	case OpHostDrain:
		h, ok := s.hosts[c.Host]
		if !ok {
			return nil, structs.Errf(structs.CodeNotFound, "no host %s", c.Host)
		}
		h.Drained = c.Drain
		return func() { s.hosts[c.Host] = h }, fs.Put("host/"+c.Host, h)
	case OpHostRemoved:
		for _, p := range s.placements {
			for _, hs := range p.Hosts {
				if hs.Host == c.Host {
					return nil, structs.Errf(structs.CodeConflict, "host %s runs part of deployment %s: delete it first", c.Host, p.Deployment).
						WithDetail("deployment", p.Deployment)
				}
			}
		}
		return func() { delete(s.hosts, c.Host) }, fs.Delete("host/" + c.Host)
	case OpPlaced:
		p := *c.Placement
		for _, hs := range p.Hosts {
			if _, ok := s.hosts[hs.Host]; !ok {
				return nil, structs.Errf(structs.CodeNotFound, "deployment %s names host %s, which is not a member", p.Deployment, hs.Host)
			}
		}
		if err := s.routesFreeLocked(p.Deployment, p.Routes); err != nil {
			return nil, err
		}
		return func() { s.placements[p.Deployment] = &p; s.rebuildRoutes() }, fs.Put("placement/"+p.Deployment, p)
	case OpUnplaced:
		return func() { delete(s.placements, c.Deployment); s.rebuildRoutes() }, fs.Delete("placement/" + c.Deployment)
	case OpRestored:
		return s.applyRestored(fs, c.State)
	}
	return nil, structs.Errf(structs.CodeInternal, "unknown server command %q", c.Op)
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
	cp := *p
	cp.Hosts = append([]HostShare(nil), p.Hosts...)
	return &cp, true
}

// Placements returns every placement, by deployment name.
func (s *State) Placements() []*Placement {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Placement, 0, len(s.placements))
	for _, p := range s.placements {
		cp := *p
		cp.Hosts = append([]HostShare(nil), p.Hosts...)
		out = append(out, &cp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Deployment < out[j].Deployment })
	return out
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

// stateSnapshot is the whole state as Snapshot encodes it.
type stateSnapshot struct {
	Hosts      []HostRecord `json:"hosts"`
	Placements []*Placement `json:"placements"`
}

// Snapshot returns the whole state (hosts and placements) encoded, for a
// replicated log's snapshot; Restore takes it back.
func (s *State) Snapshot() ([]byte, error) {
	data, err := json.Marshal(stateSnapshot{Hosts: s.Hosts(), Placements: s.Placements()})
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "encode the server's state")
	}
	return data, nil
}

// decodeSnapshot decodes a Snapshot's encoding and checks it holds
// together: names unique, every placement's hosts among the hosts.
func decodeSnapshot(data []byte) (stateSnapshot, error) {
	var snap stateSnapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return snap, structs.Errf(structs.CodeSnapshotInvalid, "a server state snapshot does not decode: %v", err)
	}
	hosts := map[string]bool{}
	for _, h := range snap.Hosts {
		if h.Name == "" || hosts[h.Name] {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot names host %q twice or without a name", h.Name)
		}
		hosts[h.Name] = true
	}
	deps := map[string]bool{}
	for _, p := range snap.Placements {
		if p == nil || p.Deployment == "" || deps[p.Deployment] {
			return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot has an empty or repeated placement")
		}
		deps[p.Deployment] = true
		for _, hs := range p.Hosts {
			if !hosts[hs.Host] {
				return snap, structs.Errf(structs.CodeSnapshotInvalid, "the snapshot places deployment %s on host %s, which it does not list", p.Deployment, hs.Host)
			}
		}
	}
	return snap, nil
}

// applyRestored replaces the whole state with a snapshot's in the
// command's transaction (OpRestored).
func (s *State) applyRestored(fs *store.FleetState, data json.RawMessage) (func(), error) {
	snap, err := decodeSnapshot(data)
	if err != nil {
		return nil, err
	}
	for name := range s.hosts {
		if err := fs.Delete("host/" + name); err != nil {
			return nil, err
		}
	}
	for dep := range s.placements {
		if err := fs.Delete("placement/" + dep); err != nil {
			return nil, err
		}
	}
	hosts := make(map[string]HostRecord, len(snap.Hosts))
	placements := make(map[string]*Placement, len(snap.Placements))
	for _, h := range snap.Hosts {
		hosts[h.Name] = h
		if err := fs.Put("host/"+h.Name, h); err != nil {
			return nil, err
		}
	}
	for _, p := range snap.Placements {
		placements[p.Deployment] = p
		if err := fs.Put("placement/"+p.Deployment, p); err != nil {
			return nil, err
		}
	}
	return func() { s.hosts, s.placements = hosts, placements; s.rebuildRoutes() }, nil
}

// Restore replaces the whole state with a Snapshot's: the store's in one
// transaction, then memory. A snapshot that does not decode changes
// nothing.
func (s *State) Restore(data []byte) error {
	var snap stateSnapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return structs.Errf(structs.CodeInternal, "a server state snapshot does not decode: %v", err)
	}
	hosts := make(map[string]HostRecord, len(snap.Hosts))
	placements := make(map[string]*Placement, len(snap.Placements))
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.st.ReplaceFleetState(func(fs *store.FleetState) error {
		for _, h := range snap.Hosts {
			hosts[h.Name] = h
			if err := fs.Put("host/"+h.Name, h); err != nil {
				return err
			}
		}
		for _, p := range snap.Placements {
			if p == nil {
				continue
			}
			placements[p.Deployment] = p
			if err := fs.Put("placement/"+p.Deployment, p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return structs.Wrap(structs.CodeStoreUnavailable, err, "restore the server's state")
	}
	s.hosts, s.placements = hosts, placements
	s.rebuildRoutes()
	return nil
}
