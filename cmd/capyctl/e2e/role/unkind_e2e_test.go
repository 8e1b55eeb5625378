// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
)

// TestUnkind_ParkedResidueBeyondThePlaceholder: two vLLM models of 14 GiB
// on one 24 GiB card (22.1 GiB managed), whose engine keeps 12 GiB on the
// card while parked, far above the ledger's 1 GiB placeholder, and which,
// as vLLM, refuses to start when the card has less free than
// gpu_memory_utilization × total. a is parked; a request for b must not
// start b beside a on the placeholder's word (the fake vLLM would refuse:
// 12 GiB free, about 15 asked): the ledger charges a what its processes were
// measured to keep, so b does not fit beside it, a is stopped and b
// answers. Nothing is ever over the card.
func TestUnkind_ParkedResidueBeyondThePlaceholder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a role and fake engines")
	}
	r := e2e.SwitchRole(t, map[string][]string{"sticky": {"--env", "CAPYCTL_FAKE_SIM_PARK_RESIDUE=12GiB"}},
		map[string][2]string{"a": {"sticky", "  residency = \"deep\"\n"}, "b": {"sticky", "  residency = \"deep\"\n"}})
	if status, body := chat(t, r, "a"); status != http.StatusOK {
		t.Fatalf("chat a: %d %s", status, body)
	}
	if out, errOut, code := r.CLI("park", "deployment", "a", "--wait"); code != 0 {
		t.Fatalf("park a: exit %d\n%s%s", code, out, errOut)
	}
	per, total := cardUse(t, r)
	if total < 12<<30 {
		t.Fatalf("parked a holds %d bytes on the card (%v), want its 12 GiB residue", total, per)
	}
	st := deploymentStatus(t, r, "a")
	if len(st.Instances) != 1 || st.Instances[0].State != "parked" {
		t.Fatalf("a after its park: %+v", st.Instances)
	}
	ledgerWithinLimits(t, r)

	// b: 14 GiB asked of a card with 12 GiB free beside parked a.
	status, body := chat(t, r, "b")
	if status != http.StatusOK {
		logs, _, _ := r.CLI("logs", "deployment", "b")
		t.Fatalf("chat b beside a parked with a 12 GiB residue: %d %s\nb's engine log:\n%s", status, body, logs)
	}
	if a := deploymentStatus(t, r, "a"); len(a.Instances) != 1 || a.Instances[0].State != "stopped" {
		t.Fatalf("a is %+v after b took the card: want stopped (its parked residue does not fit beside b)", a.Instances)
	}
	if logs, _, _ := r.CLI("logs", "deployment", "b"); strings.Contains(logs, "Free memory on device") {
		t.Fatalf("b was started into a card without room (vLLM's refusal in its log):\n%s", logs)
	}
	ledgerWithinLimits(t, r)
}
