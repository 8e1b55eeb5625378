// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// hasEngine reports whether a host's last share names the engine.
func hasEngine(l *fakeLocal, name string) bool {
	for _, e := range l.lastDesired().GetEngines() {
		if e.GetName() == name {
			return true
		}
	}
	return false
}

// TestDesired_EnginesReachEveryHost: an engine registration of the
// cluster reaches every linked host in its share, with the leader's term,
// and a host that links later; each host's answer wakes the server's
// wait; taking it back reaches them too.
func TestDesired_EnginesReachEveryHost(t *testing.T) {
	s := testServer(t, ServerOptions{})
	a := newFakeLocal()
	joinHost(t, s, "gpu-a", a)
	waitReady(t, s, "gpu-a")
	if err := s.apply(fsm.EngineRegistered{Engine: fsm.EngineRecord{Name: "vllm", Request: json.RawMessage(`{"name":"vllm","path":"/opt/vllm"}`)}}); err != nil {
		t.Fatal(err)
	}
	registered := s.State.Applied()
	poll.Until(t, 10*time.Second, "gpu-a's share names the engine", func() bool { return hasEngine(a, "vllm") })
	if d := a.lastDesired(); d.GetTerm() != s.cl.node.Term() || d.GetTerm() == 0 {
		t.Fatalf("the share's term %d, the leader's %d", d.GetTerm(), s.cl.node.Term())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if done, refused := s.hostAnswers(ctx, registered, "engine", "vllm"); len(done) != 1 || len(refused) != 0 {
		t.Fatalf("answers: done %v refused %v", done, refused)
	}

	b := newFakeLocal()
	b.refuse = structs.CodeEngineNotFound
	joinHost(t, s, "gpu-b", b)
	waitReady(t, s, "gpu-b")
	poll.Until(t, 10*time.Second, "a host linked later gets the engine", func() bool { return hasEngine(b, "vllm") })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	done, refused := s.hostAnswers(ctx2, registered, "engine", "vllm")
	if len(done) != 1 || refused["gpu-b"] == nil || refused["gpu-b"].Code != structs.CodeEngineNotFound {
		t.Fatalf("answers: done %v refused %v", done, refused)
	}

	if err := s.apply(fsm.EngineRemoved{Name: "vllm"}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the removal reaches both", func() bool { return !hasEngine(a, "vllm") && !hasEngine(b, "vllm") })
}

// testLogger is a logger that discards.
func testLogger() hclog.Logger { return hclog.NewNullLogger() }

// TestWaitApplied_AShareNotSentAgain: a write that leaves a host's share
// as it was (a change to another host's share; a change undone before the
// host's link read it) is not sent to that host again, so no answer of
// the host ever names its index. A wait for that index ends on the host's
// answer to the share it already holds, which says what the write says;
// before, it waited out its whole bound (a group's stop waited 10 min in
// TestEvictGroups_OnlyOnTheRefusingHost when the link coalesced a
// member's running-then-stopped share).
func TestWaitApplied_AShareNotSentAgain(t *testing.T) {
	s := testServer(t, ServerOptions{})
	a, b := newFakeLocal(), newFakeLocal()
	joinHost(t, s, "gpu-a", a)
	joinHost(t, s, "gpu-b", b)
	waitReady(t, s, "gpu-a")
	waitReady(t, s, "gpu-b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.waitApplied(ctx, "gpu-a", s.State.Applied()); err != nil {
		t.Fatalf("gpu-a's answer to its first share: %v", err)
	}
	before := a.lastDesired()

	// Only gpu-b's share changes.
	p := &Placement{Deployment: "only-b", Routes: []string{"only-b"}, Revision: 1, At: time.Now().UTC(),
		Spec:  json.RawMessage(`{"name":"only-b","engine":"vllm","routes":["only-b"]}`),
		Hosts: []HostShare{{Host: "gpu-b", Instances: 1}}}
	if err := s.apply(fsm.Placed{Placement: p}); err != nil {
		t.Fatal(err)
	}
	index := s.State.Applied()
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	got, err := s.waitApplied(wctx, "gpu-a", index)
	if err != nil {
		t.Fatalf("a wait for gpu-a's answer at index %d, whose share did not change: %v", index, err)
	}
	if got.GetIndex() >= index {
		t.Fatalf("gpu-a answered a share at index %d although its share did not change (the test no longer shows a share not sent again)", got.GetIndex())
	}
	if a.lastDesired() != before {
		t.Fatal("gpu-a was sent its share again")
	}
}
