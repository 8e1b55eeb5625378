// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// EnvFaults opts in to the full suite (make faults sets it).
const EnvFaults = "CAPYCTL_FAULTS"

// EnvFaultsOut names a file the full suite writes its Markdown table to.
const EnvFaultsOut = "CAPYCTL_FAULTS_OUT"

// TestFaults_Quick runs three faults on little traffic: the suite's code
// runs in every make test (the stop under a stopped driver is the real
// processes' check of the review's L2).
func TestFaults_Quick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts roles")
	}
	rows := runAll(t, []Fault{KillDriver(), SlowBody(), StopDuringDriverStop()}, Quick)
	t.Logf("\n%s", Markdown(rows))
}

// TestFaults_Suite is make faults: every fault at full scale.
func TestFaults_Suite(t *testing.T) {
	if os.Getenv(EnvFaults) != "1" {
		t.Skipf("the fault-injection suite runs with %s=1 (make faults)", EnvFaults)
	}
	rows := runAll(t, All(), Full)
	table := Markdown(rows)
	// The attack rows (attacks.go): a server and its hosts attacked as a
	// network peer, a local user and a compromised host.
	table += "\n" + AttackMarkdown(runAttacks(t, Attacks(), AttacksFull))
	fmt.Printf("\n%s\n", table)
	if p := os.Getenv(EnvFaultsOut); p != "" {
		if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
			t.Errorf("write %s: %v", p, err)
		}
	}
}

// runAll runs faults one at a time, each on its own role, and fails the
// test for every goal a fault missed (the row says it too).
func runAll(t *testing.T, faults []Fault, s Scale) []Row {
	var rows []Row
	for _, f := range faults {
		t.Run(strings.ReplaceAll(f.Name, " ", "_"), func(t *testing.T) {
			row := Run(t, f, s)
			rows = append(rows, row)
			if row.Skipped != "" {
				t.Skip(row.Skipped)
			}
			t.Logf("%s: failed %s; served again after %s; engines %s; lost %s; ledger %s; %s",
				row.Fault, row.Failed, row.ServedAgain, row.Engines, row.Lost, row.Ledger, row.Notes)
			for _, p := range row.Problems {
				t.Errorf("%s: %s", row.Fault, p)
			}
		})
	}
	return rows
}
