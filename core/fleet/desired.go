// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/sha256"

	"google.golang.org/protobuf/proto"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// Desired state, as Nomad's clients pull their allocations: the leader
// commits what every host should run (engine registrations, deployments'
// shares) through raft; each host's link on the leader sends the host its
// share, whole, when the link comes up and whenever the share changes
// (serveLink); the host reconciles what it runs with it through its own
// lifecycle and ledger and answers DesiredApplied, which wakes the
// server's waits on the host's change signal (liveHost.changed). Every
// share carries the leader's raft term: a host refuses one older than the
// newest term it has seen, so a deposed leader's late word changes
// nothing.

// desiredFor is a host's share of the desired state, as this server
// would send it: nil unless it leads (and its state is the cluster's:
// after its barrier).
func (s *Server) desiredFor(host string) *hostv1.Desired {
	s.mu.Lock()
	leading := s.leaderCtx != nil
	s.mu.Unlock()
	if !leading {
		return nil
	}
	d := &hostv1.Desired{Term: s.cl.node.Term(), Index: s.State.Applied()}
	for _, e := range s.State.Engines() {
		d.Engines = append(d.Engines, &hostv1.DesiredEngine{Name: e.Name, RequestJson: e.Request})
	}
	d.Deployments = append(s.desiredDeployments(host), s.desiredMembers(host)...)
	return d
}

// desiredDigest identifies a share by what a host does with it: the term
// counts (a new leader's share is sent again), the index does not.
func desiredDigest(d *hostv1.Desired) [32]byte {
	cp := proto.Clone(d).(*hostv1.Desired)
	cp.Index = 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(cp)
	return sha256.Sum256(b)
}

// waitApplied waits until a host answered a share read at index or later
// (in this server's term), and returns its answer; host_unreachable when
// its link is down, or ctx ends first.
func (s *Server) waitApplied(ctx context.Context, host string, index uint64) (*hostv1.DesiredApplied, error) {
	for {
		s.mu.Lock()
		h := s.hosts[host]
		var ch <-chan struct{}
		var a *hostv1.DesiredApplied
		up := false
		var sentIndex, sameThrough uint64
		if h != nil {
			ch, a, up = h.changed.changed(), h.applied, h.linkCancel != nil
			sentIndex, sameThrough = h.sentIndex, h.sameThrough
		}
		s.mu.Unlock()
		switch {
		case h == nil || !up:
			return nil, structs.Errf(structs.CodeHostUnreachable, "host %s is not connected", host).WithDetail("host", host)
		case a != nil && a.GetTerm() == s.cl.node.Term() &&
			(a.GetIndex() >= index || a.GetIndex() >= sentIndex && sameThrough >= index):
			// Its answer to index or later, or to the last share sent,
			// which is still the same at index (not sent again).
			return a, nil
		}
		select {
		case <-ctx.Done():
			return nil, structs.Errf(structs.CodeHostUnreachable, "host %s did not answer its desired state in time", host).WithDetail("host", host)
		case <-ch:
		}
	}
}

// resultOf returns a host's result for one engine or deployment of its
// share: nil when it did it.
func resultOf(a *hostv1.DesiredApplied, kind, name string) *structs.Error {
	if a.GetCode() != "" {
		return structs.Errf(structs.Code(a.GetCode()), "%s", a.GetMessage())
	}
	for _, r := range a.GetResults() {
		if r.GetKind() == kind && r.GetName() == name && r.GetCode() != "" {
			return structs.Errf(structs.Code(r.GetCode()), "%s", r.GetMessage())
		}
	}
	return nil
}
