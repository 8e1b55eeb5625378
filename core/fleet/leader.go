// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// barrierTimeout bounds a new leader's wait for the entries committed
// before its election to be applied here.
const barrierTimeout = 30 * time.Second

// monitorLeadership runs the leader's duties while raft says this server
// leads, and stops them (their context cancelled, their goroutines waited
// for) as soon as it says it does not: raft's leadership signal decides,
// never a poll. It also stops the server when it finds itself removed
// from the configuration.
func (s *Server) monitorLeadership() {
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	member := false
	for {
		leads, changed := s.cl.node.Leadership()
		switch {
		case leads && stop == nil:
			stop = s.startLeading()
		case !leads && stop != nil:
			stop()
			stop = nil
			s.logger.Info("no longer the leader of the server cluster")
		}
		if in, known := s.inConfiguration(); known {
			if member && !in {
				s.fail(structs.Errf(structs.CodeServerRemoved,
					"server %s was removed from the cluster (capyctl remove server): it stops; move its state directory away and join it again with a new server join token", s.cl.name))
			}
			member = member || in
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.State.Halted():
			code := structs.CodeServerCommandUnknown
			var se *structs.Error
			if errors.As(s.State.HaltErr(), &se) {
				code = se.Code // a store that refused the write
			}
			s.fail(structs.Wrap(code, s.State.HaltErr(), "server %s stops applying the replicated log", s.cl.name))
			return
		case <-changed:
		}
	}
}

// inConfiguration reports whether this server is in the raft
// configuration it knows (known is false for an empty one).
func (s *Server) inConfiguration() (in, known bool) {
	servers := s.cl.node.View().Servers
	return s.isMember(servers), len(servers) > 0
}

// fail reports a reason the server must stop (Fatal), once.
func (s *Server) fail(err error) {
	s.logger.Error("the server stops", "error", err)
	select {
	case s.fatal <- err:
	default:
	}
}

// Fatal carries an error that must stop the server role: a command of the
// replicated log it cannot apply, its removal from the cluster.
func (s *Server) Fatal() <-chan error { return s.fatal }

// startLeading runs the leader's duties under a context of their own and
// returns what stops them.
func (s *Server) startLeading() (stop func()) {
	ctx, cancel := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.lead(ctx, &wg)
	}()
	return func() {
		s.mu.Lock()
		s.leaderCtx = nil
		s.mu.Unlock()
		s.leading.publish()
		cancel()
		wg.Wait()
	}
}

// lead waits until every entry committed before this election is applied
// here (raft's barrier: the leader's state is then the cluster's), then
// does what a new leader owes the cluster and starts the leader's loops
// on wg.
func (s *Server) lead(ctx context.Context, wg *sync.WaitGroup) {
	for {
		err := s.cl.node.Barrier(barrierTimeout)
		if err == nil {
			break
		}
		s.logger.Warn("a new leader's barrier failed; trying again", "error", err)
		if structs.HasCode(err, structs.CodeNotLeader) || structs.HasCode(err, structs.CodeShuttingDown) || !sleepCtx(ctx, time.Second) {
			return
		}
	}
	st := s.cl.node.Stats()
	s.logger.Info("leading the server cluster", "term", st.Term, "applied", s.State.Applied())
	s.establishLeadership(ctx)
	since := time.Now()
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.superviseGroups(ctx)
	}()
	go func() {
		defer wg.Done()
		s.rescheduleLoop(ctx, since)
	}()
}

// establishLeadership is a new leader's first work: its own address in
// the configuration, the cluster's record, the state it carried from
// before raft, and the deployments its linked hosts report that no
// placement names.
func (s *Server) establishLeadership(ctx context.Context) {
	s.updateOwnAddress()
	if s.State.Cluster() == nil {
		expect := max(s.o.BootstrapExpect, 1)
		if err := s.apply(fsm.ClusterConfigured{Expect: expect}); err != nil {
			s.logger.Warn("record the cluster's expected size", "error", err)
		}
	}
	if storeMeta(s.o.Store, metaCarryDue) != "" {
		s.carryState()
	}
	s.mu.Lock()
	s.leaderCtx = ctx // from now on, the hosts' journals may adopt and their links send desired state
	for _, h := range s.hosts {
		if h.linkCancel != nil {
			s.adoptLaterLocked(ctx, h)
		}
	}
	s.mu.Unlock()
	s.leading.publish()
}

// growExpect raises the cluster's expected size to its voters when a
// server joined beyond it (a server alone grown into a cluster, or one
// more server than bootstrap_expect): the expectation follows what the
// operator did, so that status reads "3 of 3", not "3 of 1". Removing a
// server does not lower it: a cluster below the size it reached is
// degraded until a server joins again in its place.
func (s *Server) growExpect() {
	voters := 0
	for _, m := range s.cl.node.Stats().Servers {
		if m.Voter {
			voters++
		}
	}
	if voters <= s.expect() {
		return
	}
	if err := s.apply(fsm.ClusterConfigured{Expect: voters}); err != nil {
		s.logger.Warn("record the cluster's expected size", "voters", voters, "error", err)
	}
}

// updateOwnAddress records this server's advertised address in the
// configuration when it changed since it was added (a new
// cluster_advertise, a port bound anew): the other servers and the hosts
// dial it there.
func (s *Server) updateOwnAddress() {
	for _, m := range s.cl.node.Stats().Servers {
		if m.ID == s.cl.name && m.Address != s.advertise {
			if err := s.cl.node.AddVoter(s.cl.name, s.advertise); err != nil {
				s.logger.Warn("update this server's address in the cluster", "from", m.Address, "to", s.advertise, "error", err)
				return
			}
			s.logger.Info("this server's address changed in the cluster", "from", m.Address, "to", s.advertise)
		}
	}
}

// carryState commits, once, the state this server held before it ran raft
// (an upgrade of a server alone) as one restored command: servers that
// join later replay it from the log.
func (s *Server) carryState() {
	data, err := s.State.Snapshot()
	if err == nil {
		// Revocations this server kept in its own file before they were
		// replicated go with it.
		data, err = fsm.WithHostRevocations(data, fileRevocations(s.cl.pkiDir))
	}
	if err == nil {
		err = s.apply(fsm.Restored{State: data, Carried: true})
	}
	if err != nil {
		s.logger.Warn("carry this server's state into the replicated log; trying again at the next leadership", "error", err)
		return
	}
	if err := s.o.Store.SetMeta(metaCarryDue, ""); err != nil {
		s.logger.Warn("record the carried state", "error", err)
	}
	s.logger.Info("this server's state is in the replicated log", "hosts", len(s.State.Hosts()), "placements", len(s.State.Placements()))
}

// sleepCtx waits d unless ctx ends first (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
