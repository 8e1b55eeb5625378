// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// A model of the switching trace's card, without processes: the same
// arrivals (makeTrace) on four models of which two fit at once, the
// trace's costs, and a family of switching policies wider than turns, so
// that what any of them can reach on this trace (p95 against switches) is
// known before a policy is built. Issue 26 asks for 2x on both against
// the policy before turns; BenchmarkSwitching_PolicyFrontier prints the
// best p95 found for each count of evictions (the frontier).
//
// IMPORTANT: a model, not a measurement. Its costs are the trace's (a
// cold start of 20 s, a wake of the weights at 8 GiB/s from host RAM or
// 2.33 GiB/s from disk, answers of 2 s) plus simModelOverhead for each
// park and wake; everything else CapyCTL adds (the role's HTTP and driver
// calls, the 2-core machine's scheduling at 10x speed) is left out, so the
// real role does somewhat worse than the model at the same evictions
// (turns at 30 s: 45 evictions for p95 31.5 s of trace time in the bench,
// 41 for 31.1 s in the model).

// simModelOverhead is what the model adds to each park and wake (trace
// time, seconds).
const simModelOverhead = 0.3

// simPolicy is one switching policy of the model. A model that waits
// (out of memory, requests waiting) takes a place at once when one is
// free; otherwise it forces a switch when its longest-waiting request has
// waited its bound less what the switch is expected to take (turns'
// turn_time is one bound for every model). A forced switch evicts one
// resident whose least turn is over, chosen by victim; with idle set, a
// resident that has been idle that long is evicted at once for any model
// that waits (turns' "the queue is empty" end).
type simPolicy struct {
	bound  [4]float64 // by traceModels' order, trace seconds
	least  float64    // least turn, from ready
	idle   float64    // 0: no idle ends
	victim string     // "rate" (least asked for), "lru" (least recent arrival), "queue" (fewest requests held, then rate)
}

func (p simPolicy) String() string {
	idle := "no idle ends"
	if p.idle > 0 {
		idle = "idle ends after " + strconv.FormatFloat(p.idle, 'g', -1, 64) + "s"
	}
	return fmt.Sprintf("bounds %v s, least turn %gs, %s, victim by %s", p.bound, p.least, idle, p.victim)
}

// simOutcome is a policy's figures on one trace (trace seconds).
type simOutcome struct {
	p95, p99  float64
	evictions int
	refused   int // waited past the request's bound
	// tailFirstMinute counts the requests at or past p95 that arrived in
	// the first minute.
	tailFirstMinute int
}

type simState int

const (
	simStopped simState = iota
	simStarting
	simReady
	simDraining // its turn ended: in-flight requests finish, then it parks
	simParking
	simParked
	simWaking
)

type simModel struct {
	state    simState
	until    float64 // end of a start, wake or park
	level    int     // park level: 1 in host RAM, 2 dropped
	queue    []int   // waiting requests (trace indexes)
	inflight []float64
	readyAt  float64
	lastBusy float64
	lastArr  float64
}

func (s *simModel) holdsPlace() bool {
	return s.state == simStarting || s.state == simReady || s.state == simDraining || s.state == simParking || s.state == simWaking
}

// simulateTrace runs a policy on a trace with a step of dt (trace
// seconds).
func simulateTrace(trace []traceRequest, p simPolicy, dt float64) simOutcome {
	const (
		start   = 20.0
		answer  = 2.0  // 100 tokens at 50 tokens/s
		hostRAM = 15.0 // GiB: 16 GiB less the 1 GiB reserve
		wakeL1  = 8.0  // GiB/s
		wakeL2  = 2.33 // GiB/s
	)
	weights := make([]float64, len(traceModels))
	rate := make([]float64, len(traceModels))
	index := map[string]int{}
	for k, m := range traceModels {
		w, _ := strconv.ParseFloat(strings.TrimSuffix(m.weights, "GiB"), 64)
		weights[k], rate[k], index[m.name] = w, m.perMin/60, k
	}
	wake := func(k, level int) float64 {
		if level == 2 {
			return simModelOverhead + weights[k]/wakeL2
		}
		return simModelOverhead + weights[k]/wakeL1
	}
	ms := make([]*simModel, len(traceModels))
	for k := range ms {
		ms[k] = &simModel{}
	}
	at := make([]float64, len(trace))
	lat := make([]float64, len(trace))
	for i, tr := range trace {
		at[i], lat[i] = tr.at.Seconds(), -1
	}
	var out simOutcome
	var promised []int // models a place is being freed for, in order
	next := 0
	for t := 0.0; t < traceDuration.Seconds()+2*traceDeadline.Seconds(); t += dt {
		for next < len(trace) && at[next] <= t {
			k := index[trace[next].model]
			ms[k].queue = append(ms[k].queue, next)
			ms[k].lastArr = at[next]
			next++
		}
		for k, m := range ms {
			m.inflight = deleteDone(m.inflight, t)
			switch m.state {
			case simStarting, simWaking:
				if t >= m.until {
					m.state, m.readyAt = simReady, t
				}
			case simDraining:
				if len(m.inflight) == 0 {
					host := 0.0
					for j, o := range ms {
						if (o.state == simParked || o.state == simParking) && o.level == 1 {
							host += weights[j]
						}
					}
					m.level = 1
					if host+weights[k] > hostRAM {
						m.level = 2
					}
					m.state, m.until = simParking, t+simModelOverhead
					out.evictions++
				}
			case simParking:
				if t >= m.until {
					m.state = simParked
				}
			}
		}
		for _, m := range ms {
			if m.state == simReady {
				for _, i := range m.queue {
					lat[i] = t + answer - at[i]
					m.inflight = append(m.inflight, t+answer)
				}
				m.queue = m.queue[:0]
			}
			if len(m.queue) > 0 || len(m.inflight) > 0 {
				m.lastBusy = t
			}
		}
		// Free places: to the models promised one, then to the oldest
		// request's model.
		for {
			held := 0
			for _, m := range ms {
				if m.holdsPlace() {
					held++
				}
			}
			if held >= 2 {
				break
			}
			pick := -1
			if len(promised) > 0 {
				pick, promised = promised[0], promised[1:]
			} else {
				oldest := math.Inf(1)
				for k, m := range ms {
					if (m.state == simStopped || m.state == simParked) && len(m.queue) > 0 && at[m.queue[0]] < oldest {
						oldest, pick = at[m.queue[0]], k
					}
				}
			}
			if pick < 0 {
				break
			}
			if m := ms[pick]; m.state == simStopped {
				m.state, m.until = simStarting, t+start
			} else {
				m.state, m.until = simWaking, t+wake(pick, m.level)
			}
		}
		// Switches: the waiting models, most overdue first.
		type waiter struct {
			k       int
			overdue float64
		}
		var ws []waiter
		for k, m := range ms {
			if (m.state != simStopped && m.state != simParked) || len(m.queue) == 0 || slices.Contains(promised, k) {
				continue
			}
			in := start
			if m.state == simParked {
				in = wake(k, m.level)
			}
			ws = append(ws, waiter{k, t - at[m.queue[0]] - (p.bound[k] - in - simModelOverhead - answer/2)})
		}
		sort.Slice(ws, func(i, j int) bool { return ws[i].overdue > ws[j].overdue })
		for _, w := range ws {
			victim, best := -1, math.Inf(1)
			for k, m := range ms {
				if m.state != simReady || t-m.readyAt < p.least {
					continue
				}
				idle := p.idle > 0 && len(m.queue) == 0 && len(m.inflight) == 0 && t-m.lastBusy >= p.idle
				if w.overdue < 0 && !idle {
					continue
				}
				var score float64
				switch p.victim {
				case "rate":
					score = rate[k]
				case "lru":
					score = m.lastArr
				default:
					score = float64(len(m.queue)+len(m.inflight))*10 + rate[k]
				}
				if score < best {
					victim, best = k, score
				}
			}
			if victim < 0 {
				continue
			}
			ms[victim].state = simDraining
			promised = append(promised, w.k)
		}
	}
	sorted := make([]float64, 0, len(lat))
	for i := range lat {
		if lat[i] < 0 || lat[i] > traceDeadline.Seconds()+answer {
			out.refused++
			lat[i] = math.Inf(1) // slower than any answer, as in the bench
		}
		sorted = append(sorted, lat[i])
	}
	sort.Float64s(sorted)
	q := func(f float64) float64 { return sorted[min(len(sorted)-1, int(f*float64(len(sorted))))] }
	out.p95, out.p99 = q(.95), q(.99)
	for i := range lat {
		if lat[i] >= out.p95 && at[i] < 60 {
			out.tailFirstMinute++
		}
	}
	return out
}

func deleteDone(ds []float64, t float64) []float64 {
	j := 0
	for _, d := range ds {
		if d > t {
			ds[j] = d
			j++
		}
	}
	return ds[:j]
}

// simPolicies is the family the model searches: one bound for every model
// or a longer one for the least-asked model (m4), least turns, idle ends
// or none, and three victim rules.
func simPolicies() []simPolicy {
	var ps []simPolicy
	for x := 18.0; x <= 34; x += 2 {
		for _, rare := range []float64{0, 34, 38} {
			if rare != 0 && rare <= x {
				continue
			}
			for _, least := range []float64{0, 5, 10} {
				for _, idle := range []float64{0, 2} {
					for _, victim := range []string{"rate", "lru", "queue"} {
						p := simPolicy{bound: [4]float64{x, x, x, x}, least: least, idle: idle, victim: victim}
						if rare != 0 {
							p.bound[3] = rare
						}
						ps = append(ps, p)
					}
				}
			}
		}
	}
	return ps
}

// BenchmarkSwitching_PolicyFrontier runs the model of the switching trace
// for every policy of simPolicies and prints the frontier: for each count of
// evictions, the least p95 any policy reached with none refused (trace
// seconds; the bench's replay shows them divided by 10). Then the best
// policy at 45 evictions or fewer on three other seeds, against one bound
// for all, to show whether it is a property of the policy or of this
// trace. It starts no process and takes seconds.
func BenchmarkSwitching_PolicyFrontier(b *testing.B) {
	trace := makeTrace()
	type row struct {
		p simPolicy
		o simOutcome
	}
	var rows []row
	for _, p := range simPolicies() {
		if o := simulateTrace(trace, p, 0.05); o.refused == 0 {
			rows = append(rows, row{p, o})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].o.evictions != rows[j].o.evictions {
			return rows[i].o.evictions < rows[j].o.evictions
		}
		return rows[i].o.p95 < rows[j].o.p95
	})
	best := math.Inf(1)
	var at45 *row
	for i, r := range rows {
		if r.o.evictions <= 45 && (at45 == nil || r.o.p95 < at45.o.p95) {
			at45 = &rows[i]
		}
		if r.o.p95 >= best {
			continue
		}
		best = r.o.p95
		b.Logf("frontier: %3d evictions, p95 %5.1f s, p99 %5.1f s (p95 x evictions %4.0f s; %d of the tail in the first minute): %s",
			r.o.evictions, r.o.p95, r.o.p99, r.o.p95*float64(r.o.evictions), r.o.tailFirstMinute, r.p)
	}
	if at45 == nil {
		b.Fatal("no policy at 45 evictions or fewer")
	}
	b.ReportMetric(at45.o.p95, "best-p95-s-at-45-evictions")
	for _, seed := range []uint64{1, 2, 3} {
		other := makeTraceSeed(seed)
		o := simulateTrace(other, at45.p, 0.05)
		u := simulateTrace(other, simPolicy{bound: [4]float64{26, 26, 26, 26}, victim: "lru"}, 0.05)
		b.Logf("seed %d: that policy %d evictions, p95 %.1f s; one bound of 26 s for all, no idle ends: %d evictions, p95 %.1f s",
			seed, o.evictions, o.p95, u.evictions, u.p95)
	}
	for i := 0; i < b.N; i++ {
	}
}
