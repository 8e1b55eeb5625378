// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"encoding/json"
	"sort"
	"time"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Engine registrations are desired state: `capyctl engine add` on a
// server commits one, and every host registers it (a host that joins
// later too), from the same request.

const prefixEngine = "engine/"

// Command types of engine registrations.
const (
	TypeEngineRegistered Type = "engine_registered"
	TypeEngineRemoved    Type = "engine_removed"
)

// EngineRegistered records an engine every host registers.
type EngineRegistered struct {
	Engine EngineRecord `json:"engine"`
}

// EngineRemoved takes a registration back: hosts remove the engine (a
// host refuses while a deployment of its own uses it).
type EngineRemoved struct {
	Name string `json:"name"`
}

func (EngineRegistered) CommandType() Type { return TypeEngineRegistered }
func (EngineRemoved) CommandType() Type    { return TypeEngineRemoved }

// EngineRecord is one desired engine registration.
type EngineRecord struct {
	Name string `json:"name"`
	// Request is the registration as the operator asked it (the
	// management API's POST /engines body): each host runs it.
	Request json.RawMessage `json:"request"`
	At      time.Time       `json:"at"`
}

func (s *State) applyEngineRegistered(fs *store.FleetState, c EngineRegistered, at time.Time) (func(), any, error) {
	e := c.Engine
	if e.Name == "" || len(e.Request) == 0 {
		return nil, nil, structs.Errf(structs.CodeInvalidRequest, "an engine registration names the engine and its request")
	}
	if _, ok := s.engines[e.Name]; ok {
		return nil, nil, structs.Errf(structs.CodeEngineExists, "engine %s is registered on the cluster already (capyctl engine remove %s first)", e.Name, e.Name).
			WithDetail("engine", e.Name)
	}
	e.At = at
	return func() { s.engines[e.Name] = e }, nil, fs.Put(prefixEngine+e.Name, e)
}

func (s *State) applyEngineRemoved(fs *store.FleetState, c EngineRemoved) (func(), any, error) {
	if _, ok := s.engines[c.Name]; !ok {
		return nil, nil, structs.Errf(structs.CodeEngineNotFound, "no engine %s is registered on the cluster", c.Name).WithDetail("engine", c.Name)
	}
	return func() { delete(s.engines, c.Name) }, nil, fs.Delete(prefixEngine + c.Name)
}

// Engines returns the desired engine registrations, by name.
func (s *State) Engines() []EngineRecord {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.enginesLocked()
}

func (s *State) enginesLocked() []EngineRecord {
	out := make([]EngineRecord, 0, len(s.engines))
	for _, e := range s.engines {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Engine returns one desired engine registration.
func (s *State) Engine(name string) (EngineRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.engines[name]
	return e, ok
}
