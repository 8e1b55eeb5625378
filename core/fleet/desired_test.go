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
