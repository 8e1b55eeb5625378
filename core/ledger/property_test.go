// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestLedger_Property drives random sequences of place, phase change,
// forecast, observation and release against a ledger and checks, after
// every step, that no domain is charged over its managed limit or over its
// capacity minus its free reserve, that the sums agree with the owners,
// that refused changes and forecasts leave the ledger exactly as it was,
// and that a forecast agrees with the change it forecast.
func TestLedger_Property(t *testing.T) {
	seeds := 64
	steps := 300
	if testing.Short() {
		seeds = 8
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
		l, domains := randomLedger(t, rng)
		owners := make([]string, 12)
		for i := range owners {
			owners[i] = fmt.Sprintf("dep%d/0", i)
		}
		for step := range steps {
			id := owners[rng.IntN(len(owners))]
			where := fmt.Sprintf("seed %d step %d", seed, step)
			switch op := rng.IntN(6); op {
			case 0, 1: // place
				p := randomPlan(rng, l, domains)
				phase := []string{PhaseStartup, PhaseReady, PhaseParked}[rng.IntN(3)]
				before := l.Snapshot()
				f, err := l.ForecastPlace(id, p, phase)
				if err != nil {
					t.Fatalf("%s: forecast: %v", where, err)
				}
				if !reflect.DeepEqual(before, l.Snapshot()) {
					t.Fatalf("%s: a forecast changed the ledger", where)
				}
				_, err = l.Place(id, p, phase)
				if (err == nil) != f.Fits {
					t.Fatalf("%s: forecast fits=%v but place err=%v", where, f.Fits, err)
				}
				if err != nil && !reflect.DeepEqual(before, l.Snapshot()) {
					t.Fatalf("%s: a refused place changed the ledger", where)
				}
			case 2: // phase change
				if !l.Has(id) {
					continue
				}
				phase := Phases[rng.IntN(len(Phases))]
				before := l.Snapshot()
				if _, err := l.SetPhase(id, phase); err != nil && !reflect.DeepEqual(before, l.Snapshot()) {
					t.Fatalf("%s: a refused phase change changed the ledger", where)
				}
			case 3: // release
				l.Release(id)
			case 4: // a bare forecast of arbitrary charges
				c := randomCharges(rng, domains)
				before := l.Snapshot()
				_ = l.Forecast(id, c)
				if !reflect.DeepEqual(before, l.Snapshot()) {
					t.Fatalf("%s: a forecast changed the ledger", where)
				}
			case 5: // an observation of memory held outside CapyCTL
				d := domains[rng.IntN(len(domains))]
				if err := l.SetExternal(d.Name, rng.Int64N(d.Capacity/2+1)); err != nil {
					t.Fatal(err)
				}
			}
			checkInvariants(t, where, l)
		}
	}
}

// checkInvariants: no domain over its limits; sums equal the owners' charges.
func checkInvariants(t *testing.T, where string, l *Ledger) {
	t.Helper()
	s := l.Snapshot()
	sums := make(map[string]int64)
	for _, o := range s.Owners {
		for d, b := range o.Charges {
			if b < 0 {
				t.Fatalf("%s: owner %s has a negative charge in %s", where, o.ID, d)
			}
			sums[d] += b
		}
	}
	for _, d := range s.Domains {
		if d.Charged > d.ManagedLimit {
			t.Fatalf("%s: %s charged %d over its managed limit %d", where, d.Name, d.Charged, d.ManagedLimit)
		}
		if d.Charged > d.Capacity-d.FreeReserve {
			t.Fatalf("%s: %s charged %d over capacity %d minus reserve %d", where, d.Name, d.Charged, d.Capacity, d.FreeReserve)
		}
		if d.Charged != sums[d.Name] {
			t.Fatalf("%s: %s sum %d, owners hold %d", where, d.Name, d.Charged, sums[d.Name])
		}
	}
}

func randomLedger(t *testing.T, rng *rand.Rand) (*Ledger, []Domain) {
	t.Helper()
	var domains []Domain
	if rng.IntN(4) == 0 {
		c := (16 + rng.Int64N(112)) * gib
		domains = append(domains, Domain{Name: DomainUnified, Kind: KindUnified, Capacity: c, ManagedLimit: c / 2, FreeReserve: c / 5})
	} else {
		c := (16 + rng.Int64N(240)) * gib
		domains = append(domains, Domain{Name: DomainSystem, Kind: KindSystem, Capacity: c, ManagedLimit: c / 2, FreeReserve: c / 5})
		for i := range 1 + rng.IntN(4) {
			c := (8 + rng.Int64N(80)) * gib
			reserve := max(gib, c*8/100)
			managed := c - reserve
			if rng.IntN(2) == 0 {
				managed = managed * (50 + rng.Int64N(50)) / 100
			}
			domains = append(domains, Domain{Name: DeviceDomain(i), Kind: KindDevice, Capacity: c, ManagedLimit: managed, FreeReserve: reserve})
		}
	}
	l, err := New(domains)
	if err != nil {
		t.Fatal(err)
	}
	return l, domains
}

func randomCharges(rng *rand.Rand, domains []Domain) Charges {
	c := make(Charges, len(domains))
	for i, d := range domains {
		if rng.IntN(3) == 0 {
			continue
		}
		c[i] = rng.Int64N(d.Capacity * 3 / 4)
	}
	return c
}

func randomPlan(rng *rand.Rand, l *Ledger, domains []Domain) Plan {
	ready := randomCharges(rng, domains)
	startup := make(Charges, len(ready))
	parked := make(Charges, len(ready))
	for i := range ready {
		startup[i] = ready[i] + rng.Int64N(4*gib)
		parked[i] = ready[i] / (1 + rng.Int64N(8))
	}
	return Plan{Startup: startup, Ready: ready, Parked: parked}
}
