// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// The compromised host's attacks on what it reports (H3, M2, M3 of the
// trust review): a second host ("gpu-b") joins, its key and certificate
// are stolen, its agent stops, and the stolen identity drives its link.

// takeOver joins gpu-b, steals its identity and stops its agent (kill:
// true, SIGKILL: a host that never comes back).
func takeOver(e *AttackEnv) *attack.CompromisedHost {
	victim := harness.StartHost(e.T, e.Server, harness.HostOptions{Name: "gpu-b"})
	if !hostReady(e.Server, "gpu-b", e.Scale.Recover) {
		e.T.Fatalf("gpu-b not ready")
	}
	id, err := attack.StealHostIdentity(victim.StateDir)
	if err != nil {
		e.T.Fatalf("steal gpu-b's identity: %v", err)
	}
	victim.Stop()
	return &attack.CompromisedHost{ID: id, Server: e.Server.ClusterAddr}
}

// stolenLink opens the stolen identity's link (with a 24 GiB card), or
// fails the row.
func stolenLink(e *AttackEnv, bad *attack.CompromisedHost) *attack.Link {
	hello := &hostv1.Hello{HostName: bad.ID.Name, Protocol: 1, Inventory: &hostv1.Inventory{
		Cards: []*hostv1.Card{{Uuid: "GPU-stolen", Name: "Stolen", MemoryBytes: 24 << 30}}, HostMemoryBytes: 64 << 30}}
	var link *attack.Link
	var err error
	if !waitUntil(e.Scale.Recover, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		link, err = bad.Link(ctx, hello)
		return err == nil
	}) {
		e.T.Fatalf("the stolen identity's link: %v", err)
	}
	return link
}

// refusedCounts reads the server's capyctl_host_messages_refused_total
// of host, by reason.
func refusedCounts(e *AttackEnv, host string) map[string]int {
	m, err := e.Server.Metrics(context.Background())
	if err != nil {
		e.Problem("read the server's metrics: %v", err)
		return nil
	}
	out := map[string]int{}
	prefix := `capyctl_host_messages_refused_total{host="` + host + `",reason="`
	for series, v := range m {
		if reason, ok := strings.CutPrefix(series, prefix); ok {
			out[strings.TrimSuffix(reason, `"}`)] = int(v)
		}
	}
	return out
}

// hostInstances is how many instances the server lists of host, and the
// size of its answer.
func hostInstances(e *AttackEnv, host string) (int, int) {
	out, code, _ := e.CLI(30*time.Second, "status", "host", host, "--json")
	if code != 0 {
		e.Problem("capyctl status host %s: exit %d: %s", host, code, firstLine(out))
		return 0, len(out)
	}
	var d wire.HostDetail
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		e.Problem("capyctl status host %s --json: %v", host, err)
	}
	return len(d.Instances), len(out)
}

// sendUntilRefused sends n messages of msg on link and returns how many
// went before the server closed the link.
func sendUntilRefused(link *attack.Link, n int, msg func(i int) *hostv1.HostMessage) int {
	for i := 0; i < n; i++ {
		if link.Send(msg(i)) != nil {
			return i
		}
	}
	return n
}

// CompromisedHostFlood (H3): the stolen identity sends one message of
// 3 MiB, 2000 events of 3.5 KiB at once, then 20 000 instance journals of
// deployments nobody placed. The server refuses the large message (the
// link ends), journals the events only within their bytes a second,
// keeps at most 512 instances of the host, and ends the link of a host
// over its messages a second (host_link_flooded); every refusal counted.
func CompromisedHostFlood() Attack {
	return Attack{Name: "compromised host floods its link: a 3 MiB message, 2000 events of 3.5 KiB, 20 000 journals", Finding: "H3",
		Inject: func(e *AttackEnv) {
			bad := takeOver(e)
			link := stolenLink(e, bad)
			_ = link.Send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "engine_added",
				Message: strings.Repeat("x", 3<<20)}}})
			link.Close()
			link = stolenLink(e, bad)
			sent := sendUntilRefused(link, 2000, func(int) *hostv1.HostMessage {
				return &hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "engine_added",
					Attributes: map[string]string{"engine": "x"}, Message: strings.Repeat("e", 3500)}}}
			})
			e.Note("2000 events of 3.5 KiB: %d sent before the link closed", sent)
			defer link.Close()
			journals := sendUntilRefused(link, 20000, func(i int) *hostv1.HostMessage {
				return &hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{
					InstanceId: fmt.Sprintf("junk%d/0", i), Deployment: fmt.Sprintf("junk%d", i), State: "ready", Placed: true,
					Message: strings.Repeat("j", 1000)}}}
			})
			e.Note("20 000 journals: the link closed after %d", journals)
			var counts map[string]int
			if !waitUntil(e.Scale.Recover, func() bool {
				counts = refusedCounts(e, "gpu-b")
				return counts["message_too_large"] > 0 && counts["events_over_rate"] > 0 && counts["over_rate"]+counts["too_many_instances"] > 0
			}) {
				e.Problem("refusals counted: %v; want message_too_large, events_over_rate and over_rate or too_many_instances", counts)
			}
			e.Note("refused (capyctl_host_messages_refused_total): %s", orNone(counts))
			// What the server keeps of the host's last link (a new link's
			// Hello replaces it).
			n, size := hostInstances(e, "gpu-b")
			e.Note("capyctl status host gpu-b: %d instances, %d KiB", n, size>>10)
			if n > 512 {
				e.Problem("the server keeps %d instances of one host, over 512", n)
			}
		}}
}

// CompromisedHostLies (M2): the stolen identity reports 1 PiB free on its
// 24 GiB card, forges events (host_lost, deployment_deleted of the honest
// host's model), and reports a deployment of its own with 10 000 routes.
// A deploy without placement.hosts must go to the honest host; the forged
// events, readings and the adoption are refused and counted.
func CompromisedHostLies() Attack {
	return Attack{Name: "compromised host reports 1 PiB free, forges events about others, reports a deployment of 10 000 routes", Finding: "M2",
		Inject: func(e *AttackEnv) {
			bad := takeOver(e)
			link := stolenLink(e, bad)
			defer link.Close()
			link.Beat(300*time.Millisecond, []*hostv1.LedgerReading{{Domain: "gpu0", DeviceUuid: "GPU-stolen", CapacityBytes: 1 << 50, RoomBytes: 1 << 50}})
			routes := make([]string, 10000)
			for i := range routes {
				routes[i] = fmt.Sprintf("route-%d-%s", i, strings.Repeat("r", 90))
			}
			stop, err := bad.ServeRelay(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(wire.DeploymentStatus{Name: "grab", Routes: routes, Revision: 1})
			}))
			if err != nil {
				e.T.Fatalf("the stolen identity's relay: %v", err)
			}
			defer stop()
			if !hostReady(e.Server, "gpu-b", e.Scale.Recover) {
				e.Problem("the stolen identity's link and relay were not taken")
				return
			}
			for _, m := range []*hostv1.HostMessage{
				{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "host_lost"}}},
				{Body: &hostv1.HostMessage_Event{Event: &hostv1.Event{Kind: "deployment_deleted", Attributes: map[string]string{"deployment": trafficDep}}}},
				{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{InstanceId: "grab/0", Deployment: "grab", State: "ready"}}},
			} {
				if err := link.Send(m); err != nil {
					e.Problem("send: %v", err)
				}
			}
			var counts map[string]int
			if !waitUntil(e.Scale.Recover, func() bool {
				counts = refusedCounts(e, "gpu-b")
				return counts["event_kind"] > 0 && counts["event_not_its_own"] > 0 && counts["readings_over_inventory"] > 0 && counts["invalid"] > 0
			}) {
				e.Problem("refusals counted: %v; want event_kind, event_not_its_own, readings_over_inventory and invalid (the adoption)", counts)
			}
			e.Note("refused: %s", orNone(counts))
			if out, _, _ := e.Server.CLI("list", "deployments"); strings.Contains(out, "grab") {
				e.Problem("the host's deployment of 10 000 routes was adopted")
			}
			// A deploy with no placement.hosts: the most free memory wins,
			// and the 1 PiB was not believed.
			spec := strings.Replace(attackSpec("anywhere", "gpu-a"), "  placement {\n    hosts = [\"gpu-a\"]\n  }\n", "", 1)
			e.Honest.WriteFile("models/anywhere/README", "fake model\n")
			ctx, cancel := context.WithTimeout(context.Background(), e.Scale.Recover)
			defer cancel()
			done := make(chan int, 1)
			go func() {
				_, _, code := e.Server.Deploy("anywhere", spec, "--activate", "--wait")
				done <- code
			}()
			select {
			case code := <-done:
				if code != 0 {
					e.Problem("a deploy with no placement.hosts: exit %d (placed on the lying host?)", code)
				} else {
					e.Note("a deploy with no placement.hosts went to the honest host and became ready")
				}
			case <-ctx.Done():
				e.Problem("a deploy with no placement.hosts did not finish within %s (placed on the lying host?)", e.Scale.Recover)
			}
		}}
}

// LostHostRemoved (M3): a host with a deployment it made itself (adopted
// by the server) is killed and never comes back; `capyctl remove host`
// must forget the deployment (its model name free again, deployable on
// the honest host) and revoke the host.
func LostHostRemoved() Attack {
	return Attack{Name: "a host that never comes back, with a deployment it made itself, removed", Finding: "M3",
		Inject: func(e *AttackEnv) {
			s := e.Scale
			victim := harness.StartHost(e.T, e.Server, harness.HostOptions{Name: "gpu-b"})
			if !hostReady(e.Server, "gpu-b", s.Recover) {
				e.T.Fatalf("gpu-b not ready")
			}
			poll.Until(e.T, s.Recover, "gpu-b gets the engine the server registered", func() bool {
				out, _, code := victim.CLI("engine", "list", "--json")
				return code == 0 && strings.Contains(out, `"`+engineName+`"`)
			})
			victim.WriteFile("models/own/README", "fake model\n")
			spec := strings.Replace(attackSpec("own", "gpu-b"), "  placement {\n    hosts = [\"gpu-b\"]\n  }\n", "", 1)
			if out, errOut, code := victim.Deploy("own", spec, "--activate", "--wait"); code != 0 {
				e.T.Fatalf("deploy on gpu-b itself: exit %d\n%s%s", code, out, errOut)
			}
			if !waitUntil(s.Recover, func() bool {
				out, _, code := e.Server.CLI("list", "deployments")
				return code == 0 && strings.Contains(out, "own")
			}) {
				e.Problem("the server did not adopt gpu-b's own deployment")
				return
			}
			victim.Kill9()
			if !waitUntil(s.Recover, func() bool { return !hostReady(e.Server, "gpu-b", time.Second) }) {
				e.Problem("gpu-b was not lost after its agent was killed")
			}
			out, code, _ := e.CLI(60*time.Second, "remove", "host", "gpu-b")
			if code != 0 {
				e.Problem("remove the lost host gpu-b: exit %d: %s", code, firstLine(out))
				return
			}
			e.Note("gpu-b (its own deployment adopted) killed; capyctl remove host gpu-b: exit 0")
			if out, _, _ := e.Server.CLI("list", "deployments"); strings.Contains(out, "own") {
				e.Problem("the removed host's deployment is still listed")
			}
			e.Honest.WriteFile("models/own/README", "fake model\n")
			if out, errOut, code := e.Server.Deploy("own", attackSpec("own", "gpu-a"), "--activate", "--wait"); code != 0 {
				e.Problem("its model name was not free again: deploy own on gpu-a: exit %d: %s%s", code, firstLine(out), firstLine(errOut))
			} else {
				e.Note("its model name deployed again on the honest host")
			}
		}}
}
