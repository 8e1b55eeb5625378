// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

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
// and relay) and reports: the time of one placement decision (the hosts
// that take placements, most free card first), the CPU and memory this
// process spends on heartbeats (every host beats every 200 ms here, ten
// times the default rate; hosts' and server's sides together, so an upper
// bound of the server's). The route table's rebuild is fsm's
// BenchmarkState_RebuildRoutes.
func BenchmarkScale_100Hosts(b *testing.B) {
	scaleOnce.Do(func() {
		const hosts = 100
		s := testServer(b, ServerOptions{Heartbeat: 200 * time.Millisecond})
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
		time.Sleep(time.Second) // the first heartbeats
		runtime.GC()
		runtime.ReadMemStats(&ms1)

		// Heartbeats: CPU over 5 s of steady state.
		cpu0, wall0 := cpuTime(), time.Now()
		time.Sleep(5 * time.Second)
		cpu, wall := cpuTime()-cpu0, time.Since(wall0)
		beats := float64(hosts) * wall.Seconds() / 0.2

		// One placement decision.
		const rounds = 2000
		t0 := time.Now()
		for i := 0; i < rounds; i++ {
			if c := s.candidates(nil); len(c) != hosts {
				b.Fatalf("candidates: %d", len(c))
			}
		}
		place := time.Since(t0) / rounds

		scale = map[string]float64{
			"join-100-hosts-s":          joined.Seconds(),
			"placement-decision-us":     float64(place.Microseconds()) + float64(place.Nanoseconds()%1000)/1000,
			"heartbeat-cpu-us/beat":     float64(cpu.Microseconds()) / beats,
			"heartbeat-cpu-%-of-a-core": 100 * cpu.Seconds() / wall.Seconds(),
			"heap-KiB/host":             float64(int64(ms1.HeapInuse+ms1.StackInuse)-int64(ms0.HeapInuse+ms0.StackInuse)) / 1024 / hosts,
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
