// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// eightCards is a host of eight 80 GiB cards with some charged.
type eightCards struct{ fakeLocal }

func (l *eightCards) Inventory() *hostv1.Inventory {
	inv := &hostv1.Inventory{HostMemoryBytes: 1 << 40}
	for i := 0; i < 8; i++ {
		inv.Cards = append(inv.Cards, &hostv1.Card{Uuid: fmt.Sprintf("GPU-%d", i), Index: uint32(i), Name: "Sim", MemoryBytes: 80 << 30})
	}
	return inv
}

func (l *eightCards) Readings() []*hostv1.LedgerReading {
	out := []*hostv1.LedgerReading{{Domain: "system", CapacityBytes: 1 << 40, RoomBytes: 1 << 39}}
	for i := 0; i < 8; i++ {
		out = append(out, &hostv1.LedgerReading{Domain: fmt.Sprintf("gpu%d", i), DeviceUuid: fmt.Sprintf("GPU-%d", i),
			CapacityBytes: 80 << 30, RoomBytes: 74 << 30, ChargedBytes: int64(i) << 30})
	}
	return out
}

var (
	scaleOnce sync.Once
	scale     map[string]float64
)

// BenchmarkScale_100Hosts registers 100 simulated hosts of 8 cards each with
// one server (all in this process, each host with its own certificate, link
// and relay, beating at the default 2 s) and reports issue 27's figures:
// memory per host; CPU at idle (a share of one core) and per heartbeat
// (that CPU over the beats: an upper bound, idle work included); the time
// and CPU of one placement decision (the hosts that take placements, most
// free card first); and of one placement made (its raft command, the
// host's share sent and answered, through createPlaced). Hosts' and
// server's sides are counted together, so each is an upper bound of the
// server's. CPU of a step is the process's less the idle rate over its
// time. The route table's rebuild is fsm's BenchmarkState_RebuildRoutes.
func BenchmarkScale_100Hosts(b *testing.B) {
	scaleOnce.Do(func() {
		const hosts = 100
		s := testServer(b, ServerOptions{Heartbeat: DefaultHeartbeat})
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		for i := 0; i < hosts; i++ {
			joinHost(b, s, fmt.Sprintf("gpu-%03d", i), &eightCards{})
		}
		poll.Until(b, 60*time.Second, "100 hosts ready", func() bool {
			n := 0
			for _, h := range s.Hosts() {
				if h.State == "ready" {
					n++
				}
			}
			return n == hosts
		})
		joined := time.Since(start)
		time.Sleep(DefaultHeartbeat + 500*time.Millisecond) // the first heartbeats
		runtime.GC()
		runtime.ReadMemStats(&ms1)

		// At idle: CPU over 10 s of steady state, heartbeats included.
		cpu0, wall0 := cpuTime(), time.Now()
		time.Sleep(10 * time.Second)
		idle, idleWall := cpuTime()-cpu0, time.Since(wall0)
		idleRate := idle.Seconds() / idleWall.Seconds() // CPU seconds per second
		beats := float64(hosts) * idleWall.Seconds() / DefaultHeartbeat.Seconds()
		// busy is the CPU a step of wall time took beyond the idle rate.
		busy := func(cpu, wall time.Duration) float64 {
			return max(cpu.Seconds()-idleRate*wall.Seconds(), 0)
		}

		// One placement decision.
		const rounds = 2000
		cpu0, t0 := cpuTime(), time.Now()
		for i := 0; i < rounds; i++ {
			if c := s.candidates(nil); len(c) != hosts {
				b.Fatalf("candidates: %d", len(c))
			}
		}
		decideWall := time.Since(t0)
		decideCPU := busy(cpuTime()-cpu0, decideWall)

		// Placements made: each its raft command, its host's share sent,
		// applied and answered.
		const placements = 100
		var took []time.Duration
		cpu0, t0 = cpuTime(), time.Now()
		for i := 0; i < placements; i++ {
			name := fmt.Sprintf("scale-%02d", i)
			raw := json.RawMessage(`{"name":"` + name + `","engine":"vllm","model":{"path":"` + name + `"},"routes":["` + name + `"]}`)
			spec, err := api.SpecFromJSON(raw)
			if err != nil {
				b.Fatal(err)
			}
			p0 := time.Now()
			if _, err := s.createPlaced(context.Background(), spec, raw, false); err != nil {
				b.Fatalf("place %s: %v", name, err)
			}
			took = append(took, time.Since(p0))
		}
		placeCPU := busy(cpuTime()-cpu0, time.Since(t0))
		slices.Sort(took)

		scale = map[string]float64{
			"join-100-hosts-s":                joined.Seconds(),
			"heap-KiB/host":                   float64(int64(ms1.HeapInuse+ms1.StackInuse)-int64(ms0.HeapInuse+ms0.StackInuse)) / 1024 / hosts,
			"idle-cpu-%-of-a-core":            100 * idleRate,
			"heartbeat-cpu-us/beat":           float64(idle.Microseconds()) / beats,
			"placement-decision-us":           float64(decideWall.Nanoseconds()) / rounds / 1000,
			"placement-decision-cpu-us":       decideCPU * 1e6 / rounds,
			"placement-made-p50-ms":           float64(took[len(took)/2].Microseconds()) / 1000,
			"placement-made-cpu-us/placement": placeCPU * 1e6 / placements,
		}
	})
	for i := 0; i < b.N; i++ {
	}
	for k, v := range scale {
		b.ReportMetric(v, k)
	}
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
