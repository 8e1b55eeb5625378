// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// Engine registrations are desired state (fsm.EngineRegistered): `engine
// add` on a server commits the registration, every linked host registers
// it from its share, and a host that links later registers it then. The
// answer waits for the hosts linked now (on their change signals), so a
// bad path is refused at once: when every one of them refuses, the
// registration is taken back.

// engineWait bounds the wait for the linked hosts' answers (a
// registration runs the engine's version check).
const engineWait = 2 * time.Minute

// registerEngine registers an engine as the cluster's: committed, then
// waited for on the hosts linked now; taken back when every one of them
// refused it (serverapi: POST /engines without dry_run or ?host=).
func (s *Server) registerEngine(ctx context.Context, req wire.EngineAddRequest, body []byte) (wire.EngineDetected, error) {
	wctx, cancel := context.WithTimeout(ctx, engineWait)
	defer cancel()
	index, err := s.applyIndexed(fsm.EngineRegistered{Engine: fsm.EngineRecord{Name: req.Name, Request: body}}, nil)
	if err != nil {
		return wire.EngineDetected{}, err
	}
	done, refused := s.hostAnswers(wctx, index, "engine", req.Name)
	if len(done) == 0 && len(refused) > 0 {
		// Every linked host refused it: a bad registration, taken back.
		if err := s.apply(fsm.EngineRemoved{Name: req.Name}); err != nil {
			s.logger.Warn("take back an engine every host refused", "engine", req.Name, "error", err)
		}
		return wire.EngineDetected{}, firstRefusal(refused)
	}
	out := wire.EngineDetected{APIVersion: wire.APIVersion, Engine: wire.Engine{Name: req.Name, Family: req.Family, Path: req.Path}, Registered: true}
	if e, ok := s.engineOn(ctx, done, req.Name); ok {
		out.Engine = e
	}
	out.Notes = engineNotes(done, refused)
	s.event("engine_added", "", map[string]any{"engine": req.Name, "hosts": done})
	return out, nil
}

// removeEngine takes back a registration of the cluster from every host
// (engine_in_use, and nothing removed, when a host still runs a
// deployment with it); registered is false when the cluster has none of
// that name (serverapi then relays the removal to every host).
func (s *Server) removeEngine(ctx context.Context, name string) (registered bool, err error) {
	rec, desired := s.State.Engine(name)
	if !desired {
		return false, nil
	}
	wctx, cancel := context.WithTimeout(ctx, engineWait)
	defer cancel()
	index, err := s.applyIndexed(fsm.EngineRemoved{Name: name}, nil)
	if err != nil {
		return true, err
	}
	if _, refused := s.hostAnswers(wctx, index, "engine", name); len(refused) > 0 {
		if err := s.apply(fsm.EngineRegistered{Engine: fsm.EngineRecord{Name: name, Request: rec.Request}}); err != nil {
			s.logger.Warn("put back an engine a host could not remove", "engine", name, "error", err)
		}
		return true, firstRefusal(refused)
	}
	s.event("engine_removed", "", map[string]any{"engine": name})
	return true, nil
}

// hostAnswers waits until every host linked now answered a share read at
// index or later (one that holds the change committed at index), and
// sorts them: the hosts that did kind/name, and those that refused it (by
// host). A host that does not answer in time, or whose link breaks, is
// left out of both.
func (s *Server) hostAnswers(ctx context.Context, index uint64, kind, name string) (done []string, refused map[string]*structs.Error) {
	refused = map[string]*structs.Error{}
	for _, host := range s.reachable() {
		a, err := s.waitApplied(ctx, host, index)
		if err != nil {
			s.logger.Warn("no answer from a host to its desired state", "host", host, "error", err)
			continue
		}
		if e := resultOf(a, kind, name); e != nil {
			refused[host] = e
			continue
		}
		done = append(done, host)
	}
	return done, refused
}

// firstRefusal is the refusal of the first host by name, naming every
// host's.
func firstRefusal(refused map[string]*structs.Error) error {
	hosts := make([]string, 0, len(refused))
	for h := range refused {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	first := refused[hosts[0]]
	e := structs.Errf(first.Code, "host %s: %s", hosts[0], first.Message).WithDetail("host", hosts[0])
	byHost := map[string]any{}
	for _, h := range hosts {
		byHost[h] = map[string]any{"code": string(refused[h].Code), "message": refused[h].Message}
	}
	return e.WithDetail("hosts", byHost)
}

// engineNotes say where a cluster registration stands.
func engineNotes(done []string, refused map[string]*structs.Error) []string {
	var notes []string
	if len(done) == 0 && len(refused) == 0 {
		notes = append(notes, "no host is connected: each host registers the engine when it links")
	}
	for h, e := range refused {
		notes = append(notes, "host "+h+" refused it: "+string(e.Code)+": "+e.Message)
	}
	sort.Strings(notes)
	if len(done) > 0 {
		notes = append(notes, "registered on "+strings.Join(done, ", ")+"; hosts that link later register it too")
	}
	return notes
}

// engineOn reads an engine's registration from the first host that has
// it.
func (s *Server) engineOn(ctx context.Context, hosts []string, name string) (wire.Engine, bool) {
	for _, host := range hosts {
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/engines", nil, nil)
		var list wire.EngineList
		if err != nil || status != http.StatusOK || json.Unmarshal(data, &list) != nil {
			continue
		}
		for _, e := range list.Engines {
			if e.Name == name {
				return e, true
			}
		}
	}
	return wire.Engine{}, false
}
