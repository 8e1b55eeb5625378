// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestReschedule_RetriesAFailedBringUp: a lost host's deployment placed
// on another host that refuses it (its bring-up failed) is not counted
// moved: the move is tried again as a blocked one is, the new host asked
// to start it again (its share's starts grow), until the host takes it.
// Before, the next attempt found the placement no longer naming the lost
// host and counted the move done: the deployment stayed down on a host
// that had refused it.
func TestReschedule_RetriesAFailedBringUp(t *testing.T) {
	s := testServer(t, ServerOptions{RescheduleAfter: 100 * time.Millisecond})
	stopA := runHostNamed(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	raw := json.RawMessage(`{"name":"demo","engine":"vllm","model":{"path":"demo"},"routes":["demo"]}`)
	spec, err := api.SpecFromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.createPlaced(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	b := newFakeLocal()
	b.refuseDeps = structs.CodeInsufficientMemory
	runHostNamed(t, s, "gpu-b", b)
	waitReady(t, s, "gpu-b")

	// demoShare is the last share b applied that names demo, and whether
	// b refused it.
	demoShare := func() (starts uint64, refused, ok bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for i := len(b.desired) - 1; i >= 0; i-- {
			for _, d := range b.desired[i].GetDeployments() {
				if d.GetName() == "demo" {
					return d.GetStarts(), b.refuseAt[i], true
				}
			}
		}
		return 0, false, false
	}
	stopA()
	poll.Until(t, 30*time.Second, "demo moved to gpu-b and refused there", func() bool {
		_, refused, ok := demoShare()
		return ok && refused
	})
	first, _, _ := demoShare()
	b.mu.Lock()
	b.refuseDeps = ""
	b.mu.Unlock()
	poll.Until(t, 30*time.Second, "gpu-b asked to start demo again", func() bool {
		starts, refused, ok := demoShare()
		return ok && !refused && starts > first
	})
}

// TestReschedule_ARefusalNotAboutRoomIsFinal: a lost host's deployment
// placed on another host whose refusal is not about room (a reserved
// engine option: its policy) is not asked again and again: the
// reschedule_blocked event says it is not retried. Refusals about room
// (TestReschedule_RetriesAFailedBringUp) are.
func TestReschedule_ARefusalNotAboutRoomIsFinal(t *testing.T) {
	s := testServer(t, ServerOptions{RescheduleAfter: 100 * time.Millisecond})
	stopA := runHostNamed(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	raw := json.RawMessage(`{"name":"demo","engine":"vllm","model":{"path":"demo"},"routes":["demo"]}`)
	spec, err := api.SpecFromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.createPlaced(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	b := newFakeLocal()
	b.refuseDeps = structs.CodeEngineOptionReserved
	runHostNamed(t, s, "gpu-b", b)
	waitReady(t, s, "gpu-b")
	stopA()
	var retry any
	poll.Until(t, 30*time.Second, "a reschedule_blocked event for demo", func() bool {
		evs, err := s.o.Store.EventsAfter(0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == "reschedule_blocked" && e.Payload["deployment"] == "demo" {
				retry = e.Payload["retry"]
				return true
			}
		}
		return false
	})
	if retry != false {
		t.Fatalf("reschedule_blocked says retry %v for a refusal not about room, want false", retry)
	}
}

// runHostNamed joins a host named name with a fresh token and runs it
// until stop is called or the test ends.
func runHostNamed(t *testing.T, s *Server, name string, local hostagent.Local) (stop func()) {
	t.Helper()
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: name, Local: local})
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	return runHost(t, h)
}
