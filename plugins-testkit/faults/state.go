// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// State is what a role holds at one moment, as its management API and
// the process table tell: the records a fault must not lose and the
// engines it should not kill.
type State struct {
	// Deployments are "name" → "revision desired".
	Deployments map[string]string
	// Instances are instance ID → its record.
	Instances map[string]Instance
	// Ledger lists what does not add up between the memory ledger, the
	// instances and the processes; empty when consistent.
	Ledger []string
	// Dropped is the request ledger's lost records since the role started.
	Dropped uint64
}

// Instance is one instance record.
type Instance struct {
	Deployment string
	State      string
	PID        int
	Charges    map[string]int64
}

// holdsProcesses reports whether an instance in this state owns an engine
// (and so a ledger charge).
func holdsProcesses(state string) bool {
	switch state {
	case "stopped", "failed", "":
		return false
	}
	return true
}

// ledgerView is the part of the host ledger view
// (GET /management/v1/hosts) the check reads.
type ledgerView struct {
	Domains []struct {
		Name     string `json:"name"`
		Charged  int64  `json:"charged_bytes"`
		External int64  `json:"external_bytes"`
	} `json:"domains"`
	Owners []struct {
		ID      string           `json:"id"`
		Phase   string           `json:"phase"`
		Charges map[string]int64 `json:"charges"`
	} `json:"owners"`
}

// Observe reads a role's state. The ledger is consistent when every
// instance that holds an engine is one of the ledger's owners with the
// same charges and a live process, no owner is an instance without an
// engine, each domain's charge is the sum of its owners' charges, and no
// fake engine runs under the state directory that no instance records.
func Observe(ctx context.Context, r *harness.Role) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	snap, err := r.Mgmt.Snapshot(ctx)
	if err != nil {
		return State{}, fmt.Errorf("snapshot: %w", err)
	}
	hosts, err := r.Mgmt.Hosts(ctx)
	if err != nil {
		return State{}, fmt.Errorf("hosts: %w", err)
	}
	st := State{Deployments: map[string]string{}, Instances: map[string]Instance{}}
	if snap.RequestLedger != nil {
		st.Dropped = snap.RequestLedger.Dropped
	}
	for _, d := range snap.Deployments {
		st.Deployments[d.Name] = fmt.Sprintf("r%d %s", d.Revision, d.Desired)
		for _, in := range d.Instances {
			st.Instances[in.ID] = Instance{Deployment: d.Name, State: in.State, PID: in.PID, Charges: in.Charges}
		}
	}
	st.Ledger = checkLedger(st.Instances, hosts, fakeEngines(r))
	return st, nil
}

// checkLedger compares the host ledger with the instances and the live
// engine processes (see Observe).
func checkLedger(instances map[string]Instance, hosts []wire.Host, engines []int) []string {
	var bad []string
	if len(hosts) != 1 {
		return []string{fmt.Sprintf("%d hosts, want the standalone's one", len(hosts))}
	}
	var lv ledgerView
	data, _ := json.Marshal(hosts[0].Ledger)
	if err := json.Unmarshal(data, &lv); err != nil {
		return []string{fmt.Sprintf("ledger view does not decode: %v", err)}
	}
	sums := map[string]int64{}
	owners := map[string]map[string]int64{}
	for _, o := range lv.Owners {
		owners[o.ID] = o.Charges
		for dom, b := range o.Charges {
			sums[dom] += b
		}
		if in, ok := instances[o.ID]; !ok {
			bad = append(bad, fmt.Sprintf("owner %s charged but no such instance", o.ID))
		} else if !holdsProcesses(in.State) && nonZero(o.Charges) {
			bad = append(bad, fmt.Sprintf("%s is %s but still charged %v", o.ID, in.State, o.Charges))
		}
	}
	for _, d := range lv.Domains {
		if d.Charged != sums[d.Name] {
			bad = append(bad, fmt.Sprintf("%s charged %d, owners sum to %d", d.Name, d.Charged, sums[d.Name]))
		}
	}
	recorded := map[int]bool{}
	for id, in := range instances {
		if !holdsProcesses(in.State) {
			continue
		}
		if in.PID > 0 {
			recorded[in.PID] = true
		}
		if c, ok := owners[id]; !ok || !nonZero(c) {
			bad = append(bad, fmt.Sprintf("%s is %s with no charge (an engine outside the ledger)", id, in.State))
		} else if !sameCharges(c, in.Charges) {
			bad = append(bad, fmt.Sprintf("%s shows charges %v, the ledger %v", id, in.Charges, c))
		}
		if in.State == "ready" && (in.PID == 0 || !harness.Alive(in.PID)) {
			bad = append(bad, fmt.Sprintf("%s is ready on engine %d, which is gone", id, in.PID))
		}
	}
	for _, pid := range engines {
		if !recorded[pid] {
			bad = append(bad, fmt.Sprintf("engine process %d runs with no instance recording it", pid))
		}
	}
	sort.Strings(bad)
	return bad
}

// fakeEngines are the live fake-engine processes of a role (run from its
// launch directories).
func fakeEngines(r *harness.Role) []int {
	var out []int
	for _, pid := range harness.EnginePIDs(r.StateDir) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 1 && args[0] == r.FakeBin && args[1] == "serve" {
			out = append(out, pid)
		}
	}
	return out
}

func nonZero(m map[string]int64) bool {
	for _, v := range m {
		if v != 0 {
			return true
		}
	}
	return false
}

func sameCharges(a, b map[string]int64) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

// Lost lists what before had that after lacks: deployments missing or
// with another revision or desired state, instance records missing.
func Lost(before, after State) []string {
	var lost []string
	for name, want := range before.Deployments {
		got, ok := after.Deployments[name]
		switch {
		case !ok:
			lost = append(lost, "deployment "+name)
		case got != want:
			lost = append(lost, fmt.Sprintf("deployment %s was %s, now %s", name, want, got))
		}
	}
	for id := range before.Instances {
		if _, ok := after.Instances[id]; !ok {
			lost = append(lost, "instance "+id)
		}
	}
	sort.Strings(lost)
	return lost
}

// Survivors counts the engines of before that run on as the same
// instance's engine after, and names the others.
func Survivors(before, after State) (kept, of int, gone []string) {
	for id, in := range before.Instances {
		if !holdsProcesses(in.State) || in.PID == 0 {
			continue
		}
		of++
		if a, ok := after.Instances[id]; ok && a.PID == in.PID && harness.Alive(in.PID) {
			kept++
			continue
		}
		now := "none"
		if a, ok := after.Instances[id]; ok && a.PID != 0 {
			now = strconv.Itoa(a.PID)
		}
		gone = append(gone, fmt.Sprintf("%s: engine %d → %s", in.Deployment, in.PID, now))
	}
	sort.Strings(gone)
	return kept, of, gone
}
