// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"strings"
	"testing"
)

// TestAttacks_Quick runs the compromised host's rows on little traffic:
// the attack suite's code runs in every make test.
func TestAttacks_Quick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and hosts")
	}
	rows := runAttacks(t, []Attack{CompromisedHostRelay(), RemovedHostStolenCertificate(), CompromisedHostFlood(), CompromisedHostLies(),
		LostHostRemoved()}, AttacksQuick)
	t.Logf("\n%s", AttackMarkdown(rows))
}

// runAttacks runs attacks one at a time, each on its own server, and
// fails the test for every bound an attack broke (the row says it too).
func runAttacks(t *testing.T, attacks []Attack, s AttackScale) []AttackRow {
	var rows []AttackRow
	for _, a := range attacks {
		t.Run(strings.ReplaceAll(a.Finding+" "+a.Name, " ", "_"), func(t *testing.T) {
			row := RunAttack(t, a, s)
			rows = append(rows, row)
			t.Logf("%s (%s): %s; failed %s; memory %s; database %s", row.Attack, row.Finding, row.Did, row.Failed, row.Memory, row.Database)
			for _, p := range row.Problems {
				t.Errorf("%s: %s", row.Attack, p)
			}
		})
	}
	return rows
}
