// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestCreatePlaced_OneCommandRoutedOnceMade: a deployment is placed with
// one raft command (its name reserved with its shares; a second command
// marking it placed cost a synced write on every server before the
// answer). Until its host made its share (an instance of it journaled),
// a request for it is not relayed to a host that does not have it: it
// waits for the host's journal (as a request waits for a starting
// instance on a host), then is relayed; past madeWait it is answered
// unavailable "being placed", with a retry. The name stays reserved: a
// second deploy of it is refused.
func TestCreatePlaced_OneCommandRoutedOnceMade(t *testing.T) {
	s := testServer(t, ServerOptions{})
	local := newFakeLocal() // makes nothing of its share: no journal until the test adds one
	joinHost(t, s, "gpu-a", local)
	waitReady(t, s, "gpu-a")
	raw := json.RawMessage(`{"name":"demo","engine":"vllm","model":{"path":"demo"},"routes":["demo"]}`)
	spec, err := api.SpecFromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	before := s.State.Applied()
	if _, err := s.createPlaced(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	if n := s.State.Applied() - before; n != 1 {
		t.Fatalf("a deploy took %d raft commands, want 1", n)
	}
	if p, ok := s.State.Placement("demo"); !ok || p.Version != 1 || len(p.Hosts) != 1 || p.Hosts[0].Host != "gpu-a" {
		t.Fatalf("the placement: %+v %v", p, ok)
	}
	if _, err := s.createPlaced(context.Background(), spec, raw, false); !structs.HasCode(err, structs.CodeConflict) {
		t.Fatalf("the same name placed again: %v, want conflict", err)
	}

	post := relayClient(t, s)
	status := func() (int, string) {
		resp, err := post(context.Background(), `{"model":"demo","messages":[]}`)
		if err != nil {
			return 0, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After") + " " + string(b)
	}
	relayed := local.answered.Load() // the status read after the deploy
	s.madeWait.Store(int64(50 * time.Millisecond))
	code, body := status()
	s.madeWait.Store(0)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "being placed") || local.answered.Load() != relayed {
		t.Fatalf("a request while the host has not made its share: %d %s (%d relayed), want 503 being placed", code, body, local.answered.Load()-relayed)
	}

	answered := make(chan string, 1)
	go func() {
		code, body := status()
		answered <- strconv.Itoa(code) + " " + body
	}()
	poll.Until(t, 10*time.Second, "the request waiting for the host to make demo", func() bool { return s.madeWaits.Load() == 1 })
	local.mu.Lock()
	local.journals = append(local.journals, &hostv1.InstanceJournal{InstanceId: structs.InstanceID("demo", 0), Deployment: "demo",
		State: string(structs.StateStarting), SinceUnixMs: time.Now().UnixMilli(), Placed: true})
	local.mu.Unlock()
	local.changes.publish()
	select {
	case got := <-answered:
		if !strings.HasPrefix(got, "200 ") || local.answered.Load() != relayed+1 {
			t.Fatalf("the waiting request once the host journaled demo: %s (%d relayed)", got, local.answered.Load()-relayed)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting request was not answered once the host journaled demo")
	}

	// A placement taken back while a request waits for it: the request
	// is answered as for a model no deployment serves.
	raw = json.RawMessage(`{"name":"gone","engine":"vllm","model":{"path":"gone"},"routes":["gone"]}`)
	if spec, err = api.SpecFromJSON(raw); err != nil {
		t.Fatal(err)
	}
	if _, err := s.createPlaced(context.Background(), spec, raw, false); err != nil {
		t.Fatal(err)
	}
	go func() {
		resp, err := post(context.Background(), `{"model":"gone","messages":[]}`)
		if err != nil {
			answered <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- strconv.Itoa(resp.StatusCode) + " " + string(b)
	}()
	poll.Until(t, 10*time.Second, "the request waiting for the host to make gone", func() bool { return s.madeWaits.Load() == 1 })
	if err := s.apply(fsm.Unplaced{Deployment: "gone"}); err != nil {
		t.Fatal(err)
	}
	if got := <-answered; !strings.HasPrefix(got, "404 ") || !strings.Contains(got, "unknown_model") {
		t.Fatalf("a request whose placement was taken back while it waited: %s, want 404 unknown_model", got)
	}
}
