// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
)

func host(domains []map[string]any, owners []map[string]any) []wire.Host {
	return []wire.Host{{Name: "h", Ledger: map[string]any{"domains": toAny(domains), "owners": toAny(owners)}}}
}

func toAny(ms []map[string]any) []any {
	out := make([]any, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

func TestCheckLedger(t *testing.T) {
	live := os.Getpid()
	const gone = 1 << 30 // above pid_max: no such process
	charge := map[string]int64{"gpu0": 4 << 30}
	ready := Instance{Deployment: "demo", State: "ready", PID: live, Charges: charge}
	owner := map[string]any{"id": "demo/0", "phase": "ready", "charges": map[string]any{"gpu0": 4 << 30}}
	dom := func(charged int64) []map[string]any {
		return []map[string]any{{"name": "gpu0", "charged_bytes": charged}}
	}
	cases := []struct {
		name      string
		instances map[string]Instance
		hosts     []wire.Host
		engines   []int
		want      string // a problem's text; "" for consistent
	}{
		{name: "consistent", instances: map[string]Instance{"demo/0": ready},
			hosts: host(dom(4<<30), []map[string]any{owner}), engines: []int{live}},
		{name: "a stopped instance with no owner is consistent",
			instances: map[string]Instance{"demo/0": {Deployment: "demo", State: "stopped"}},
			hosts:     host(dom(0), nil)},
		{name: "an engine outside the ledger", instances: map[string]Instance{"demo/0": ready},
			hosts: host(dom(0), nil), engines: []int{live}, want: "an engine outside the ledger"},
		{name: "a charge without an instance", instances: map[string]Instance{},
			hosts: host(dom(4<<30), []map[string]any{owner}), want: "no such instance"},
		{name: "a stopped instance still charged",
			instances: map[string]Instance{"demo/0": {Deployment: "demo", State: "stopped"}},
			hosts:     host(dom(4<<30), []map[string]any{owner}), want: "still charged"},
		{name: "a domain that does not add up", instances: map[string]Instance{"demo/0": ready},
			hosts: host(dom(8<<30), []map[string]any{owner}), engines: []int{live}, want: "owners sum to"},
		{name: "ready on a dead engine",
			instances: map[string]Instance{"demo/0": {Deployment: "demo", State: "ready", PID: gone, Charges: charge}},
			hosts:     host(dom(4<<30), []map[string]any{owner}), want: "which is gone"},
		{name: "an engine no instance records", instances: map[string]Instance{"demo/0": ready},
			hosts: host(dom(4<<30), []map[string]any{owner}), engines: []int{live, 4242}, want: "engine process 4242"},
		{name: "charges that differ", instances: map[string]Instance{"demo/0": {Deployment: "demo", State: "ready", PID: live, Charges: map[string]int64{"gpu0": 1}}},
			hosts: host(dom(4<<30), []map[string]any{owner}), engines: []int{live}, want: "shows charges"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := strings.Join(checkLedger(c.instances, c.hosts, c.engines), "; ")
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("problems %q, want %q", got, c.want)
			}
		})
	}
}

func TestLostAndSurvivors(t *testing.T) {
	live := os.Getpid()
	before := State{
		Deployments: map[string]string{"demo": "r1 running", "spare": "r1 running"},
		Instances: map[string]Instance{
			"demo/0":  {Deployment: "demo", State: "ready", PID: live},
			"spare/0": {Deployment: "spare", State: "ready", PID: 1 << 30},
		},
	}
	cases := []struct {
		name       string
		after      State
		lost       string
		kept, of   int
		goneSubstr string
	}{
		{name: "nothing changed", after: before, kept: 1, of: 2, goneSubstr: "spare: engine"},
		{name: "a deployment and an instance lost", after: State{
			Deployments: map[string]string{"demo": "r1 running"},
			Instances:   map[string]Instance{"demo/0": {Deployment: "demo", State: "ready", PID: live}},
		}, lost: "deployment spare, instance spare/0", kept: 1, of: 2, goneSubstr: "→ none"},
		{name: "a revision changed", after: State{
			Deployments: map[string]string{"demo": "r2 running", "spare": "r1 running"},
			Instances:   before.Instances,
		}, lost: "deployment demo was r1 running, now r2 running", kept: 1, of: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := strings.Join(Lost(before, c.after), ", "); got != c.lost {
				t.Errorf("lost %q, want %q", got, c.lost)
			}
			kept, of, gone := Survivors(before, c.after)
			if kept != c.kept || of != c.of || !strings.Contains(strings.Join(gone, ";"), c.goneSubstr) {
				t.Errorf("survivors %d/%d %v", kept, of, gone)
			}
		})
	}
}

func TestOutcomes_Failed(t *testing.T) {
	before := Outcomes{Streams: map[string]int{"ok": 5}, Requests: map[string]int{"ok": 10}}
	now := Outcomes{
		Streams:  map[string]int{"ok": 7, "stream cut": 3},
		Requests: map[string]int{"ok": 12, "connection refused": 4, "503 unavailable": 1},
	}
	got := now.Sub(before).Failed()
	want := "requests: 5 of 7 (4× connection refused, 1× 503 unavailable); streams: 3 of 5 (3× stream cut)"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestReadStream(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{name: "done", body: "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", want: "ok"},
		{name: "cut", body: "data: {\"choices\":[]}\n\n", want: "stream cut"},
		{name: "error event", body: "data: {\"error\":{\"code\":\"engine_error\"}}\n\n", want: "stream error engine_error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := readStream(context.Background(), strings.NewReader(c.body)); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestTraffic_LongestGap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	cases := []struct {
		name string
		ends []float64
		want time.Duration
	}{
		{name: "served all along", ends: []float64{0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4}, want: 500 * time.Millisecond},
		{name: "an outage in the middle", ends: []float64{0.2, 3.2, 3.4, 4.0}, want: 3 * time.Second},
		{name: "down from the start", ends: []float64{2.5, 3.0, 4.0}, want: 2500 * time.Millisecond},
		{name: "never served", want: 4 * time.Second},
		{name: "answers outside the window are ignored", ends: []float64{-1, 5}, want: 4 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := &Traffic{}
			for _, e := range c.ends {
				tr.successes = append(tr.successes, span{start: at(e - 0.1), end: at(e)})
			}
			if got := tr.LongestGap(t0, at(4)); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}
