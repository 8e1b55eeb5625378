// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"fmt"
	"testing"
)

// benchLedger is a host with system RAM and 7 cards (8 domains) holding
// 1,000 owners, each charged on the system domain and one card.
func benchLedger(b *testing.B) (*Ledger, []string, []Plan) {
	b.Helper()
	domains := []Domain{{Name: DomainSystem, Kind: KindSystem, Capacity: 2048 * gib, ManagedLimit: 1024 * gib, FreeReserve: 400 * gib}}
	for i := range 7 {
		domains = append(domains, Domain{Name: DeviceDomain(i), Kind: KindDevice, Capacity: 1024 * gib, ManagedLimit: 1000 * gib, FreeReserve: 24 * gib})
	}
	l, err := New(domains)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 1000)
	plans := make([]Plan, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("dep%d/0", i)
		card := 1 + i%7
		mk := func(dev, host int64) Charges {
			c := make(Charges, len(domains))
			c[0], c[card] = host, dev
			return c
		}
		plans[i] = Plan{Startup: mk(gib, gib/2), Ready: mk(gib*3/4, gib/2), Parked: mk(gib/8, gib/2)}
		if _, err := l.Place(ids[i], plans[i], PhaseReady); err != nil {
			b.Fatalf("place %s: %v", ids[i], err)
		}
	}
	return l, ids, plans
}

// BenchmarkLedger_Forecast forecasts a new owner's startup beside 1,000
// owners on 8 domains (the admission check of a start).
func BenchmarkLedger_Forecast(b *testing.B) {
	l, _, plans := benchLedger(b)
	next := plans[3].Startup
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if f := l.Forecast("newcomer/0", next); !f.Fits {
			b.Fatal("does not fit")
		}
	}
}

// BenchmarkLedger_Commit moves owners between phases (ready → parked →
// ready): the commit of a park and a wake, each checked.
func BenchmarkLedger_Commit(b *testing.B) {
	l, ids, _ := benchLedger(b)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		if _, err := l.SetPhase(id, PhaseParked); err != nil {
			b.Fatal(err)
		}
		if _, err := l.SetPhase(id, PhaseReady); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkLedger_PlaceRelease places a new owner with its plan and
// releases it (a start and a stop).
func BenchmarkLedger_PlaceRelease(b *testing.B) {
	l, _, plans := benchLedger(b)
	p := plans[5]
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := l.Place("newcomer/0", p, PhaseStartup); err != nil {
			b.Fatal(err)
		}
		l.Release("newcomer/0")
	}
}
