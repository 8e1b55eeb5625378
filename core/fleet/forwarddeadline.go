// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"errors"
	"time"

	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/structs"
)

// A mutation a follower relays to its leader is bounded twice (the
// fleet-trust review's M4: a follower reused a pooled connection to a
// frozen leader and a drain hung 100 s while the others had elected a new
// leader in 3):
//
//   - by the leadership it was sent to: as soon as this server's raft
//     knows another leader, or none (a follower stops hearing a frozen
//     leader within raft's heartbeat timeout), the relay ends and the
//     client gets not_leader naming the leader this server knows now; a
//     retry reaches it;
//   - by an answer deadline (ServerOptions.ForwardTimeout), for a leader
//     that keeps its leadership and still does not answer: the client gets
//     leader_unanswered.
//
// Either way the change may or may not have been made: the client retries
// with the same Idempotency-Key, which the leader's receipts answer once.

var (
	// errLeaderChanged ends a relay whose leader lost its leadership.
	errLeaderChanged = errors.New("the leader changed")
	// errRelayDeadline ends a relay the leader did not answer in time.
	errRelayDeadline = errors.New("the leader did not answer in time")
)

// forwardTimeout is the answer deadline of a relayed mutation.
func (s *Server) forwardTimeout() time.Duration {
	if s.o.ForwardTimeout > 0 {
		return s.o.ForwardTimeout
	}
	stall := s.o.GroupStallTimeout
	if stall <= 0 {
		stall = DefaultGroupStallTimeout
	}
	return stall + time.Minute
}

// relayContext returns the context of a mutation relayed to the leader of
// st, under parent (the client's request): it ends with errLeaderChanged
// once this server's raft knows another leader than st's, or none, and
// with errRelayDeadline past forwardTimeout. stop ends it and its watcher
// (the watcher has returned when stop does).
func (s *Server) relayContext(parent context.Context, st raftlog.Stats) (ctx context.Context, stop func()) {
	cctx, cancel := context.WithCancelCause(parent)
	ctx, cancelDeadline := context.WithTimeoutCause(cctx, s.forwardTimeout(), errRelayDeadline)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			changed := s.cl.node.Changed()
			if now := s.cl.node.Stats(); now.LeaderID != st.LeaderID {
				cancel(errLeaderChanged)
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() {
		cancelDeadline()
		cancel(nil)
		<-done
	}
}

// relayRefusal is a client's answer to a relay that failed with err under
// ctx (relayContext's): not_leader naming the leader known now when the
// leadership changed or the connection failed, leader_unanswered when the
// leader kept it and did not answer in time.
func (s *Server) relayRefusal(ctx context.Context, st raftlog.Stats, err error) *structs.Error {
	switch context.Cause(ctx) {
	case errLeaderChanged:
		now := s.cl.node.Stats()
		return s.notLeader(now).WithDetail("relayed_to", st.LeaderID).WithDetail("relay_error",
			"the leader "+st.LeaderID+" lost its leadership before it answered; the change may or may not have been made: retry with the same Idempotency-Key")
	case errRelayDeadline:
		return structs.Errf(structs.CodeLeaderUnanswered,
			"the leader %s at %s did not answer the relayed change within %s; it may or may not have been made: retry with the same Idempotency-Key",
			st.LeaderID, st.LeaderAddress, s.forwardTimeout()).
			WithDetail("leader_id", st.LeaderID).WithDetail("leader_address", st.LeaderAddress)
	}
	// The leader may have gone: the change was not made, or its answer
	// was lost; a retry with the same Idempotency-Key is safe.
	return s.notLeader(st).WithDetail("relay_error", err.Error())
}
