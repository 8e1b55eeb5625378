// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// compromisedHost joins a host named name (its agent never runs) and
// returns an attacker holding its stolen key and certificate.
func compromisedHost(t *testing.T, s *Server, name string) *attack.CompromisedHost {
	t.Helper()
	dir := t.TempDir()
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: dir, Server: s.Addr(), JoinToken: tok.Token, Name: name, Local: newFakeLocal()}); err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	id, err := attack.StealHostIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &attack.CompromisedHost{ID: id, Server: s.Addr()}
}

// evilLink opens the stolen identity's link with hello (nil: a Hello
// with one 24 GiB card).
func evilLink(t *testing.T, bad *attack.CompromisedHost, hello *hostv1.Hello) *attack.Link {
	t.Helper()
	if hello == nil {
		hello = &hostv1.Hello{HostName: bad.ID.Name, Protocol: 1, Inventory: &hostv1.Inventory{
			Cards: []*hostv1.Card{{Uuid: "GPU-evil", Name: "Evil", MemoryBytes: 24 << 30}}, HostMemoryBytes: 64 << 30}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := bad.Link(ctx, hello)
	if err != nil {
		t.Fatalf("the stolen identity's link: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

// linked reports whether the server holds a link of host.
func linked(s *Server, host string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	return h != nil && h.linkCancel != nil
}

// journalCount is how many instance journals the server keeps of host.
func journalCount(s *Server, host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil {
		return len(h.journals)
	}
	return 0
}

// eventsOf returns the server's journalled events a host sent (those
// carrying host_time_unix_ms), by kind.
func eventsOf(t *testing.T, s *Server, host string) map[string]int {
	t.Helper()
	out := map[string]int{}
	var after uint64
	for {
		evs, err := s.o.Store.EventsAfter(after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return out
		}
		for _, e := range evs {
			after = e.Seq
			if _, fromHost := e.Payload["host_time_unix_ms"]; fromHost && e.Payload["host"] == host {
				out[e.Kind]++
			}
		}
	}
}

// refusedOf is the refusals counted of host, by reason.
func refusedOf(s *Server, host string) map[string]uint64 { return s.guardOf(host).counts() }

// sendAll sends msgs on l, stopping at the first error (the server closed
// the link).
func sendAll(l *attack.Link, msgs func(i int) *hostv1.HostMessage, n int) (sent int) {
	for i := 0; i < n; i++ {
		if l.Send(msgs(i)) != nil {
			return i
		}
	}
	return n
}

// TestLink_ACompromisedHostIsBounded plays a compromised host (a joined
// host's stolen key and certificate driving its link) against a server
// with an honest host, the trust review's H3: a huge message, an endless
// stream of instance journals, a flood of events and one of messages.
// What the server keeps of the host stays within its bounds, the flood
// ends the link with host_link_flooded, each refusal is counted, and the
// honest host stays ready and relayed throughout.
func TestLink_ACompromisedHostIsBounded(t *testing.T) {
	// Tighter bounds than a server's, so that the test's floods are
	// small.
	limits := defaultHostLimits
	limits.rate, limits.burst, limits.instances = 200, 1000, 64
	limits.eventByteRate, limits.eventByteBurst = 32<<10, 256<<10
	s := testServer(t, ServerOptions{hostLimits: &limits})
	joinHost(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	place(t, s, "demo", "gpu-a")
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 1<<20, 2<<20))
	t.Cleanup(srv.Close)
	bad := compromisedHost(t, s, "gpu-b")
	honestServes := func(when string) {
		t.Helper()
		if code, body := relayedChat(t, srv.URL, "demo"); code != 200 {
			t.Fatalf("%s: the honest host's model answered %d %s", when, code, body)
		}
		if st := hostState(s, "gpu-a"); st != "ready" {
			t.Fatalf("%s: the honest host is %s", when, st)
		}
	}
	honestServes("before")

	t.Run("a message over the size bound ends the link", func(t *testing.T) {
		l := evilLink(t, bad, nil)
		huge := &hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "engine_added",
			Message: strings.Repeat("x", 3<<20)}}}
		_ = l.Send(huge)
		poll.Until(t, 10*time.Second, "the link of a host that sent 3 MiB at once closed", func() bool { return !linked(s, "gpu-b") })
		if n := eventsOf(t, s, "gpu-b")["engine_added"]; n != 0 {
			t.Fatalf("the 3 MiB event was journalled (%d)", n)
		}
		if refusedOf(s, "gpu-b")[refusedTooLarge] == 0 {
			t.Fatal("the refusal was not counted")
		}
	})

	t.Run("journals: at most the instances a host may hold", func(t *testing.T) {
		l := evilLink(t, bad, nil)
		n := 3 * s.limits.instances
		sendAll(l, func(i int) *hostv1.HostMessage {
			return &hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{
				InstanceId: fmt.Sprintf("junk%d/0", i), Deployment: fmt.Sprintf("junk%d", i), State: "ready", Placed: true}}}
		}, n)
		poll.Until(t, 20*time.Second, "every journal handled", func() bool {
			return uint64(journalCount(s, "gpu-b"))+refusedOf(s, "gpu-b")[refusedInstances] >= uint64(n)
		})
		if got := journalCount(s, "gpu-b"); got > s.limits.instances {
			t.Fatalf("the server keeps %d journals of one host, over %d", got, s.limits.instances)
		}
		// A journal whose strings are over their bounds is dropped.
		_ = l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{
			InstanceId: strings.Repeat("y", 4096) + "/0", State: "ready"}}})
		poll.Until(t, 10*time.Second, "the malformed journal refused", func() bool { return refusedOf(s, "gpu-b")[refusedInvalid] > 0 })
		l.Close()
		poll.Until(t, 10*time.Second, "the link closed", func() bool { return !linked(s, "gpu-b") })
	})

	t.Run("events: bounded in size and bytes a second", func(t *testing.T) {
		l := evilLink(t, bad, nil)
		before := refusedOf(s, "gpu-b")[refusedInvalid]
		attrs := map[string]string{}
		for i := 0; i <= s.limits.attributes; i++ {
			attrs[fmt.Sprintf("a%d", i)] = "v"
		}
		_ = l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "engine_added", Attributes: attrs}}})
		poll.Until(t, 10*time.Second, "the event of too many attributes refused", func() bool { return refusedOf(s, "gpu-b")[refusedInvalid] > before })
		// A long text is cut to its length, not refused.
		_ = l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "engine_added",
			Message: strings.Repeat("m", 64<<10), Attributes: map[string]string{"engine": strings.Repeat("z", 512<<10)}}}})
		poll.Until(t, 10*time.Second, "the long event journalled, cut", func() bool { return eventsOf(t, s, "gpu-b")["engine_added"] == 1 })
		// 300 events of 3.5 KiB (1 MB) at once: the events' bucket takes
		// its burst (256 KiB), the rest are dropped; the link stays.
		n := 300
		start := time.Now()
		sent := sendAll(l, func(i int) *hostv1.HostMessage {
			return &hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "engine_added",
				Message: strings.Repeat("e", 3500)}}}
		}, n)
		if sent != n {
			t.Fatalf("the link closed after %d events: %v", sent, refusedOf(s, "gpu-b"))
		}
		poll.Until(t, 20*time.Second, "every event handled", func() bool {
			return uint64(eventsOf(t, s, "gpu-b")["engine_added"])+refusedOf(s, "gpu-b")[refusedEventsRate] >= uint64(n)
		})
		took := time.Since(start).Seconds()
		kept := eventsOf(t, s, "gpu-b")["engine_added"]
		most := int((s.limits.eventByteBurst+s.limits.eventByteRate*took)/3500) + 1 // the burst and the rate meanwhile
		if kept > most {
			t.Fatalf("the server journalled %d events of 3.5 KiB of one host in %.1f s, over %d", kept, took, most)
		}
		if !linked(s, "gpu-b") {
			t.Fatal("an event flood ended the link: events over their rate are dropped, the link stays")
		}
		l.Close()
		poll.Until(t, 10*time.Second, "the link closed", func() bool { return !linked(s, "gpu-b") })
	})

	t.Run("a message flood ends the link with host_link_flooded", func(t *testing.T) {
		l := evilLink(t, bad, nil)
		n := 4 * int(s.limits.burst)
		hb := &hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: &hostv1.Heartbeat{}}}
		sendAll(l, func(int) *hostv1.HostMessage { return hb }, n)
		poll.Until(t, 20*time.Second, "the flooding host's link closed", func() bool { return !linked(s, "gpu-b") })
		if refusedOf(s, "gpu-b")[refusedOverRate] == 0 {
			t.Fatal("the flood was not counted")
		}
		// It may link again: the host's next link is taken.
		evilLink(t, bad, nil)
		poll.Until(t, 10*time.Second, "the host links again", func() bool { return linked(s, "gpu-b") })
	})

	t.Run("the refusals are a metric", func(t *testing.T) {
		text := metricsText(t, s)
		for _, reason := range []string{refusedTooLarge, refusedInstances, refusedEventsRate, refusedOverRate} {
			if !strings.Contains(text, `capyctl_host_messages_refused_total{host="gpu-b",reason="`+reason+`"}`) {
				t.Fatalf("no capyctl_host_messages_refused_total series for %s:\n%s", reason, text)
			}
		}
	})
	honestServes("after")
}

// metricsText is the server's own /metrics.
func metricsText(t *testing.T, s *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// TestLink_ACompromisedHostIsNotBelieved (M2 of the trust review): what a
// host says is checked against the replicated state and its own
// inventory. Events of a kind only servers write, or about a deployment
// placed on another host, are refused; readings of more memory than the
// host's cards hold are refused (the host does not attract placements
// with them); a deployment it reports is adopted only under the spec's
// rules (its routes' names and number), and not at all with
// adopt_host_deployments = false.
func TestLink_ACompromisedHostIsNotBelieved(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse adoption %v", refuse), func(t *testing.T) {
			s := testServer(t, ServerOptions{RefuseAdoption: refuse})
			joinHost(t, s, "gpu-a", newFakeLocal())
			waitReady(t, s, "gpu-a")
			place(t, s, "demo", "gpu-a")
			bad := compromisedHost(t, s, "gpu-b")
			l := evilLink(t, bad, nil)
			l.Beat(50*time.Millisecond, []*hostv1.LedgerReading{{Domain: "gpu0", DeviceUuid: "GPU-evil", CapacityBytes: 24 << 30, RoomBytes: 20 << 30}})
			routes := map[string][]string{"many": nil, "badroute": {"ok", "bad route\x1b[2J"}, "fine": {"fine-model"}}
			for i := 0; i < maxAdoptedRoutes+1; i++ {
				routes["many"] = append(routes["many"], fmt.Sprintf("many-%d", i))
			}
			stop, err := bad.ServeRelay(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				dep := strings.TrimPrefix(r.URL.Path, "/management/v1/deployments/")
				rs, ok := routes[dep]
				if !ok {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(wire.DeploymentStatus{Name: dep, Routes: rs, Revision: 1})
			}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
			waitReady(t, s, "gpu-b")

			event := func(kind, instance string, attrs map[string]string) *hostv1.HostMessage {
				return &hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: kind, InstanceId: instance, Attributes: attrs,
					TimeUnixMs: time.Now().UnixMilli()}}}
			}
			for _, m := range []*hostv1.HostMessage{
				event("host_lost", "", nil), // a server's kind
				event("deployment_adopted", "", map[string]string{"deployment": "mine"}), // a server's kind
				event("deployment_deleted", "", map[string]string{"deployment": "demo"}), // demo is gpu-a's
				event("instance_stopped", "demo/0", nil),                                 // demo is gpu-a's
				event("deployment_desired", "", nil),                                     // about no deployment
				event("engine_added", "", map[string]string{"engine": "fake"}),           // its own
				event("deployment_created", "", map[string]string{"deployment": "mine"}), // its own (placed nowhere)
			} {
				if err := l.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			poll.Until(t, 10*time.Second, "the host's own events journalled", func() bool {
				got := eventsOf(t, s, "gpu-b")
				return got["engine_added"] == 1 && got["deployment_created"] == 1
			})
			got := eventsOf(t, s, "gpu-b")
			for _, kind := range []string{"host_lost", "deployment_adopted", "deployment_deleted", "instance_stopped", "deployment_desired"} {
				if got[kind] != 0 {
					t.Errorf("a forged %s event was journalled: %v", kind, got)
				}
			}
			if c := refusedOf(s, "gpu-b"); c[refusedEventKind] != 2 || c[refusedEventNotOwn] != 3 {
				t.Errorf("refusals %v, want 2 event_kind and 3 event_not_its_own", c)
			}

			// 1 PiB free on its 24 GiB card: refused, and so is a card of 1 PiB.
			free := func() int64 { f, _ := s.readiness("gpu-b"); return f }
			poll.Until(t, 10*time.Second, "the honest reading taken", func() bool { return free() == 20<<30 })
			_ = l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: &hostv1.Heartbeat{Readings: []*hostv1.LedgerReading{
				{Domain: "gpu0", DeviceUuid: "GPU-evil", CapacityBytes: 1 << 50, RoomBytes: 1 << 50}}}}})
			_ = l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: &hostv1.Heartbeat{
				Inventory: &hostv1.Inventory{Cards: []*hostv1.Card{{Uuid: "GPU-evil", MemoryBytes: 1 << 50}}},
				Readings:  []*hostv1.LedgerReading{{Domain: "gpu0", DeviceUuid: "GPU-evil", CapacityBytes: 1 << 50, RoomBytes: 1 << 50}}}}})
			poll.Until(t, 10*time.Second, "both refused", func() bool {
				c := refusedOf(s, "gpu-b")
				return c[refusedReadings] >= 1 && c[refusedInventory] >= 1
			})
			if f := free(); f > 24<<30 {
				t.Fatalf("the server believes gpu-b has %d bytes free on a 24 GiB card", f)
			}

			// Its own deployments: adopted within the spec's rules only.
			for dep := range routes {
				if err := l.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{
					InstanceId: dep + "/0", Deployment: dep, State: "ready"}}}); err != nil {
					t.Fatal(err)
				}
			}
			if refuse {
				poll.Until(t, 15*time.Second, "the adoption ran", func() bool {
					s.mu.Lock()
					defer s.mu.Unlock()
					h := s.hosts["gpu-b"]
					return len(h.journals) == len(routes) && !h.adoptDue
				})
				for dep := range routes {
					if _, placed := s.State.Placement(dep); placed {
						t.Fatalf("%s adopted with adopt_host_deployments = false", dep)
					}
				}
				return
			}
			poll.Until(t, 15*time.Second, "the valid deployment adopted", func() bool { _, ok := s.State.Placement("fine"); return ok })
			poll.Until(t, 15*time.Second, "the invalid ones refused", func() bool { return refusedOf(s, "gpu-b")[refusedInvalid] >= 2 })
			for _, dep := range []string{"many", "badroute"} {
				if p, placed := s.State.Placement(dep); placed {
					t.Errorf("%s adopted with routes %q", dep, p.Routes)
				}
			}
		})
	}
}
