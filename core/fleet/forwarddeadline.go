// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"errors"
	"net/http"
	"strconv"
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
			if now := s.cl.node.View(); now.LeaderID != st.LeaderID {
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

// headerRelayDeadline carries, on a mutation a follower relays, when the
// follower gives up on the leader's answer (Unix milliseconds).
const headerRelayDeadline = "X-Capyctl-Relay-Deadline"

// relayGrace is how long past a follower's deadline the leader's handler
// of the change it relayed may go on.
const relayGrace = time.Second

// relayDeadlineKey is the context key of a relayed mutation's deadline on
// the leader.
type relayDeadlineKey struct{}

// withRelayDeadline keeps, in the context of a mutation a follower
// relayed, when the follower gives up on it (from headerRelayDeadline,
// which only a server's certificate sends: servePeer).
func withRelayDeadline(r *http.Request) *http.Request {
	ms, err := strconv.ParseInt(r.Header.Get(headerRelayDeadline), 10, 64)
	if err != nil || ms <= 0 {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), relayDeadlineKey{}, time.UnixMilli(ms)))
}

// detach returns the context a mutation's handler carries on in once its
// client may have left (a change is never left half-made because a client
// hung up), bounded by d. It still ends (the follow-up of the trust
// review's M4: a leader's handler waited out its whole bound after the
// follower that relayed the change had given up on it):
//
//   - when this server stops leading: the change is the new leader's now
//     (a retry with the same Idempotency-Key reaches it);
//   - for a change a follower relayed, when the follower gives up on it
//     (leader_unanswered): nobody waits for the answer any more.
//
// Both make the client's answer "may or may not have been made", which
// it already is when the follower gives up.
func (s *Server) detach(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(d)
	// A moment past the follower's deadline: the follower answers its
	// client leader_unanswered first, not this handler's deadline error.
	if rd, ok := ctx.Value(relayDeadlineKey{}).(time.Time); ok && rd.Add(relayGrace).Before(deadline) {
		deadline = rd.Add(relayGrace)
	}
	out, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	s.mu.Lock()
	lead := s.leaderCtx
	s.mu.Unlock()
	if lead == nil {
		return out, cancel
	}
	stop := context.AfterFunc(lead, cancel)
	return out, func() { stop(); cancel() }
}
