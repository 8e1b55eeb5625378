// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestForward_TheLeaderStopsWaitingWhenTheFollowerGaveUp is the
// follow-up of the fleet-trust review's M4: a mutation's handler on the
// leader carries on past its client's leaving (a change is never left
// half-made), for up to actionWait (10 minutes); after the follower that
// relayed it gave up (leader_unanswered at its own deadline, 3 minutes by
// default), the leader kept waiting the rest. Now the handler's wait ends
// at the follower's deadline, and as soon as the server stops leading.
func TestForward_TheLeaderStopsWaitingWhenTheFollowerGaveUp(t *testing.T) {
	s1 := testServer(t, ServerOptions{Name: "s1", RaftTuning: steadyTuning, Secrets: testSecrets})
	s2 := joinSteady(t, s1, "s2")
	poll.Until(t, 10*time.Second, "s2 follows s1", func() bool { return s2.cl.node.Stats().LeaderID == "s1" })
	var entered, left atomic.Int32
	ended := make(chan struct{})
	t.Cleanup(func() { close(ended) })
	// A leader's handler as a deployment action's: it waits for its hosts
	// in a context detached from its client, for up to actionWait.
	s1.ServeManagement(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := s1.detach(r.Context(), actionWait)
		defer cancel()
		entered.Add(1)
		select {
		case <-ctx.Done():
			left.Add(1)
		case <-ended:
		}
	}), "capyadm-test")
	notHere := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Errorf("the follower served a mutation itself") })

	t.Run("the follower gave up: leader_unanswered", func(t *testing.T) {
		s2.o.ForwardTimeout = 300 * time.Millisecond
		defer func() { s2.o.ForwardTimeout = 0 }()
		rec := relayed(t, s2, notHere, 30*time.Second)
		if code := errorCode(t, rec); code != structs.CodeLeaderUnanswered {
			t.Fatalf("relay to a hung leader: %s, want leader_unanswered", code)
		}
		poll.Until(t, 10*time.Second, "the leader's handler ends", func() bool { return left.Load() == 1 })
	})

	t.Run("the leader stops leading", func(t *testing.T) {
		answered := make(chan struct{})
		go func() { relayWithin(s2, notHere, 60*time.Second); close(answered) }()
		poll.Until(t, 10*time.Second, "the relay reaches the leader", func() bool { return entered.Load() == 2 })
		if err := s1.cl.node.TransferLeadership(); err != nil {
			t.Fatalf("s1 hands its leadership to s2: %v", err)
		}
		poll.Until(t, 20*time.Second, "the deposed leader's handler ends", func() bool { return left.Load() == 2 })
		<-answered
	})
}
