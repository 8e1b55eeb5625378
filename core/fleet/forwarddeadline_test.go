// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// hungManagement is a leader's management API that never answers: each
// request waits until its client goes (entered counts them).
func hungManagement(entered *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		<-r.Context().Done()
	})
}

// answering is a management API that answers every mutation 200 with
// the name of the server that served it.
func answering(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"served_by": name})
	})
}

// relayed sends one mutation through s as a client of its management API
// would (s relays it when it follows) and returns the answer, or fails
// the test when none comes within bound (a relay that hangs).
func relayed(t *testing.T, s *Server, served http.Handler, bound time.Duration) *httptest.ResponseRecorder {
	t.Helper()
	rec := relayWithin(s, served, bound)
	if rec == nil {
		t.Fatalf("a mutation relayed through %s had no answer within %s", s.cl.name, bound)
	}
	return rec
}

// relayWithin is relayed without the test: nil when no answer came within
// bound (the request is then cancelled).
func relayWithin(s *Server, served http.Handler, bound time.Duration) *httptest.ResponseRecorder {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/management/v1/hosts/gpu-a/actions", strings.NewReader(`{"action":"drain"}`))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ForwardMutation(served.ServeHTTP)(rec, req)
	}()
	select {
	case <-done:
		return rec
	case <-time.After(bound):
		cancel()
		<-done
		return nil
	}
}

// errorCode is the catalogue code of a management error answer.
func errorCode(t *testing.T, rec *httptest.ResponseRecorder) structs.Code {
	t.Helper()
	var env wire.ErrorEnvelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
		t.Fatalf("answer %d %q: %v", rec.Code, rec.Body.String(), err)
	}
	return structs.Code(env.Error.Code)
}

// TestForward_AHungLeaderGivesACodedAnswer pins the fleet-trust review's
// M4: a mutation a follower relayed to a leader that accepted the
// connection and never answered hung for ever. Now the relay ends with
// leader_unanswered at its answer deadline while the leader keeps its
// leadership, and with not_leader as soon as the follower's raft knows
// another leader; a retry then reaches the new leader and is served.
func TestForward_AHungLeaderGivesACodedAnswer(t *testing.T) {
	s1 := testServer(t, ServerOptions{Name: "s1", RaftTuning: steadyTuning, Secrets: testSecrets})
	s2 := joinSteady(t, s1, "s2")
	s3 := joinSteady(t, s1, "s3")
	poll.Until(t, 10*time.Second, "s2 and s3 follow s1", func() bool {
		return s2.cl.node.Stats().LeaderID == "s1" && s3.cl.node.Stats().LeaderID == "s1"
	})
	var entered atomic.Int32
	s1.ServeManagement(hungManagement(&entered), "capyadm-test")
	s2.ServeManagement(answering("s2"), "capyadm-test")
	s3.ServeManagement(answering("s3"), "capyadm-test")
	// A follower never serves a mutation itself.
	notHere := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("follower %s served a mutation itself", r.Host)
	})

	t.Run("the leader keeps its leadership", func(t *testing.T) {
		s2.o.ForwardTimeout = 300 * time.Millisecond
		defer func() { s2.o.ForwardTimeout = 0 }()
		rec := relayed(t, s2, notHere, 30*time.Second)
		if code := errorCode(t, rec); code != structs.CodeLeaderUnanswered || rec.Code != http.StatusGatewayTimeout {
			t.Fatalf("relay to a hung leader: %d %s, want 504 leader_unanswered", rec.Code, code)
		}
		if entered.Load() == 0 {
			t.Fatal("the relay never reached the leader")
		}
	})

	t.Run("the leader is replaced", func(t *testing.T) {
		// The relay's own deadline stays far away: only the leadership
		// ends it.
		answered := make(chan *httptest.ResponseRecorder, 1)
		before := entered.Load()
		go func() { answered <- relayWithin(s2, notHere, 60*time.Second) }()
		poll.Until(t, 10*time.Second, "the relay reaches the hung leader", func() bool { return entered.Load() > before })
		// The leader stops leading (as a frozen one does for the others):
		// its raft goes, its hung management API stays.
		if err := s1.cl.node.Close(); err != nil {
			t.Logf("close s1's raft: %v", err)
		}
		rec := <-answered
		if rec == nil {
			t.Fatal("a mutation relayed to a leader replaced meanwhile had no answer within 60s")
		}
		if code := errorCode(t, rec); code != structs.CodeNotLeader || rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("relay to a leader replaced meanwhile: %d %s, want 503 not_leader", rec.Code, code)
		}
		poll.Until(t, 20*time.Second, "a new leader among s2 and s3", func() bool {
			id := s2.cl.node.Stats().LeaderID
			return id == "s2" || id == "s3"
		})
		// The retry reaches the new leader (s2 serves it itself when it
		// won the election).
		leader := s2.cl.node.Stats().LeaderID
		var served http.Handler = notHere
		if leader == "s2" {
			served = answering("s2")
		}
		rec = relayed(t, s2, served, 30*time.Second)
		var got map[string]string
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got["served_by"] != leader {
			t.Fatalf("the retry: %d %s, want 200 served by %s", rec.Code, rec.Body.String(), leader)
		}
	})
}
