// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/scheduler"
	"github.com/capyctl/capyctl/core/structs"
)

// placeWait bounds a placement's whole bring-up (each host's answer and
// its ledger's verdict, host after host).
const placeWait = 3 * time.Minute

// createPlaced places a new deployment (not a group) with one raft
// command: its name and routes reserved with its first shares (refused,
// conflict, when the name is taken: the expected version 0). Each refused
// share moves on to a host not tried yet with a command naming the
// version it replaces. Refused whole (and forgotten) when no host takes
// enough: capacity_blocked with each host's refusal, or engine_not_found
// when no host has its engine. Its requests are answered "being placed"
// until a host of it made its share (placing), so no second command marks
// it placed: that one cost a synced write on every server before the
// answer (the reservation and the placement were two).
func (s *Server) createPlaced(ctx context.Context, spec *structs.Deployment, raw json.RawMessage, activate bool) (*wire.DeploymentStatus, error) {
	n := max(spec.Instances, 1)
	cands := s.candidates(spec.Placement)
	if err := noCandidates(s, spec, cands); err != nil {
		return nil, err
	}
	desired := structs.DesiredOnDemand
	if activate {
		desired = structs.DesiredRunning
	}
	p := &Placement{Deployment: spec.Name, Hosts: toShares(scheduler.Spread(n, cands)), Routes: spec.Routes, Revision: 1, At: time.Now().UTC(),
		Spec: raw, Desired: desired}
	index, err := s.commitPlacement(p, 0)
	if err != nil {
		return nil, err
	}
	// IMPORTANT: not detach: a bring-up that ends early is taken back
	// (deletePlaced), which must never race a retry's placement on a new
	// leader; it waits out placeWait as before.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), placeWait)
	defer cancel()
	if err = s.bringUp(ctx, p, index, cands, activate, p.Hosts, map[string]bool{}); err != nil {
		// Taken back: the hosts delete what they made of it before the
		// refusal is answered, so nothing is left behind on them.
		if uerr := s.deletePlaced(ctx, p); uerr != nil {
			s.logger.Warn("take back a placement no host took", "deployment", p.Deployment, "error", uerr)
		}
		return nil, err
	}
	st := s.deploymentStatus(ctx, p)
	return &st, nil
}

// noCandidates refuses a deployment no host takes now.
func noCandidates(s *Server, spec *structs.Deployment, cands []scheduler.Host) error {
	switch {
	case len(cands) > 0:
		return nil
	case spec.Placement != nil && len(spec.Placement.Hosts) > 0 && s.allDraining(spec.Placement.Hosts):
		return structs.Errf(structs.CodeHostDraining, "every host placement.hosts names (%s) is draining: capyctl drain host NAME --resume",
			strings.Join(spec.Placement.Hosts, ", ")).WithDetail("hosts", spec.Placement.Hosts)
	}
	return structs.Errf(structs.CodeCapacityBlocked, "no host takes placements now (none joined, every one lost or draining%s): capyctl list hosts",
		hostsClause(spec.Placement)).WithDetail("hosts", map[string]any{})
}

// bringUp waits for the verdicts on the shares of p in waiting (their
// change committed at index) and moves each refused share to the next
// candidate not tried yet, until every share is taken. A refusal that is
// not about room ends it.
func (s *Server) bringUp(ctx context.Context, p *Placement, index uint64, cands []scheduler.Host, activate bool, waiting []HostShare, tried map[string]bool) error {
	n := scheduler.Total(fromShares(p.Hosts))
	for _, hs := range waiting {
		tried[hs.Host] = true
	}
	refusals := map[string]any{}
	for {
		refused := map[string]bool{}
		for _, v := range s.awaitVerdicts(ctx, p.Deployment, waiting, index, activate) {
			if v.err == nil {
				continue
			}
			refusals[v.host] = refusalOf(v.err)
			if !capacityCodes[structs.CodeOf(v.err)] {
				return v.err
			}
			refused[v.host] = true
		}
		if len(refused) == 0 {
			return nil
		}
		shares, now := scheduler.Reassign(fromShares(p.Hosts), refused, cands, tried)
		waiting = nil
		for _, h := range now {
			tried[h] = true
			waiting = append(waiting, HostShare{Host: h, Instances: 1})
		}
		if scheduler.Total(shares) < n {
			code := structs.CodeCapacityBlocked
			if allCodes(refusals, structs.CodeEngineNotFound) {
				code = structs.CodeEngineNotFound // no host has the engine: not a matter of room
			}
			return structs.Errf(code, "no placement for %d instance(s) of %s: %s", n, p.Deployment, describeRefusals(refusals)).
				WithDetail("hosts", refusals)
		}
		p.Hosts = toShares(shares)
		var err error
		if index, err = s.commitPlacement(p, p.Version); err != nil {
			return err
		}
	}
}

// updatePlaced writes a new revision of a placed deployment: the spec,
// and its instances spread anew when their number changes (more go to
// hosts that take placements; fewer come off its last hosts). The hosts
// replace their instances as their share says; the answer waits for
// their word.
func (s *Server) updatePlaced(ctx context.Context, p *Placement, raw json.RawMessage, expected uint64, activate bool) (*wire.DeploymentStatus, error) {
	spec, err := specOf(raw)
	if err != nil {
		return nil, err
	}
	if spec.Name != p.Deployment {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the body names deployment %q, the path %q", spec.Name, p.Deployment)
	}
	if expected != 0 && expected != p.Revision {
		return nil, structs.Errf(structs.CodeRevisionConflict, "deployment %s is at revision %d, not %d", p.Deployment, p.Revision, expected).
			WithDetail("current_revision", p.Revision)
	}
	n := max(spec.Instances, 1)
	cands := s.candidates(spec.Placement)
	if scheduler.Total(fromShares(p.Hosts)) != n {
		p.Hosts = toShares(scheduler.Resize(fromShares(p.Hosts), n, cands))
		if scheduler.Total(fromShares(p.Hosts)) < n {
			return nil, structs.Errf(structs.CodeCapacityBlocked, "no host takes placements now for %d more instance(s) of %s", n-scheduler.Total(fromShares(p.Hosts)), p.Deployment)
		}
	}
	p.Spec, p.Routes, p.Revision, p.At = raw, spec.Routes, p.Revision+1, time.Now().UTC()
	if activate {
		p.Desired = structs.DesiredRunning
	}
	index, err := s.commitPlacement(p, p.Version)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.detach(ctx, placeWait)
	defer cancel()
	for _, v := range s.awaitVerdicts(ctx, p.Deployment, p.Hosts, index, false) {
		if v.err != nil {
			return nil, v.err
		}
	}
	st := s.deploymentStatus(ctx, p)
	return &st, nil
}

// specOf reads a deployment's spec (the management API's JSON form).
func specOf(raw json.RawMessage) (*structs.Deployment, error) {
	var probe map[string]any
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, structs.Errf(structs.CodeInvalidRequest, "the deployment is not a JSON object: %v", err)
	}
	return api.SpecFromJSON(raw)
}

// desiredWait says what a change of desired state waits for besides the
// hosts' word: a start's ledger verdict on every host (admit), every
// instance in the desired state (ready); evict lets the start make room.
type desiredWait struct{ evict, admit, ready bool }

// setDesired changes a placed deployment's desired state: every host
// follows it from its share. A start counts (Starts): the hosts start its
// stopped or failed instances again even when it was running already. The
// answer waits for the hosts' word on the change, then as w says.
func (s *Server) setDesired(ctx context.Context, p *Placement, desired string, w desiredWait) error {
	evict := w.evict && desired == structs.DesiredRunning
	since := map[string]int64{}
	if desired == structs.DesiredRunning || p.Desired != desired {
		p.Desired, p.Evict = desired, evict
		if desired == structs.DesiredRunning {
			p.Starts++
		}
		index, err := s.commitPlacement(p, p.Version)
		if err != nil {
			return err
		}
		admit := w.admit && desired == structs.DesiredRunning
		for _, v := range s.awaitVerdicts(ctx, p.Deployment, p.Hosts, index, admit) {
			if v.err != nil {
				return v.err
			}
			since[v.host] = v.started
		}
	}
	if !w.ready {
		return nil
	}
	return s.awaitState(ctx, p, desired, since)
}

// awaitState waits, on the hosts' change signals, until every instance of
// p is ready (running) or stopped (stopped), or one start gave up since
// its host began the change (since, by host, host clock: an older
// failure is not this start's).
func (s *Server) awaitState(ctx context.Context, p *Placement, desired string, since map[string]int64) error {
	want := structs.StateReady
	if desired == structs.DesiredStopped {
		want = structs.StateStopped
	}
	for _, hs := range p.Hosts {
		if err := s.awaitHostState(ctx, hs, p.Deployment, want, since[hs.Host]); err != nil {
			return err
		}
	}
	return nil
}

// awaitHostState waits until a host's instances of dep are all in want,
// or one failed since (host clock).
func (s *Server) awaitHostState(ctx context.Context, hs HostShare, dep string, want structs.InstanceState, since int64) error {
	for {
		s.mu.Lock()
		h := s.hosts[hs.Host]
		if h == nil || h.linkCancel == nil {
			s.mu.Unlock()
			return structs.Errf(structs.CodeHostUnreachable, "host %s went out of reach", hs.Host).WithDetail("host", hs.Host)
		}
		ch := h.changed.changed()
		there, failure := 0, (*structs.Error)(nil)
		for _, j := range h.journals {
			if j.GetDeployment() != dep {
				continue
			}
			st := structs.InstanceState(j.GetState())
			moving := st == structs.StateStarting || st == structs.StateWaking
			if st == want {
				there++
			} else if want == structs.StateReady && !moving && j.GetErrorCode() != "" && j.GetErrorUnixMs() >= since {
				failure = structs.Errf(structs.Code(j.GetErrorCode()), "host %s: %s", hs.Host, j.GetErrorMessage()).WithDetail("host", hs.Host)
			}
		}
		s.mu.Unlock()
		switch {
		case failure != nil:
			return failure
		case there >= hs.Instances:
			return nil
		}
		select {
		case <-ctx.Done():
			return structs.Errf(structs.CodeActivationTimeout, "deployment %s was not %s on host %s in time", dep, want, hs.Host)
		case <-ch:
		}
	}
}

// deletePlaced takes a deployment out of the desired state: each host
// stops and deletes its copy from its share (a host out of reach does
// when it links again: nothing is left behind), and the answer waits for
// the hosts linked now.
func (s *Server) deletePlaced(ctx context.Context, p *Placement) error {
	index, err := s.applyIndexed(fsm.Unplaced{Deployment: p.Deployment}, nil)
	if err != nil {
		return err
	}
	ctx, cancel := s.detach(ctx, placeWait)
	defer cancel()
	for _, hs := range p.Hosts {
		a, err := s.waitApplied(ctx, hs.Host, index)
		if err != nil {
			s.logger.Info("a deleted deployment's host is out of reach: it deletes its copy when it links again", "deployment", p.Deployment, "host", hs.Host)
			continue
		}
		if e := resultOf(a, "deployment", p.Deployment); e != nil {
			return e.WithDetail("host", hs.Host)
		}
	}
	return nil
}
