// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"testing"
)

// TestStats_RequestEndingAfterItsDeploymentWasForgottenLeavesNoSeries: a
// request gives its place back before its answer is recorded, so the
// settle loop may forget its deleted deployment in between. Before, the
// late count brought capyctl_requests_total (and refusals_total) back for
// the deleted deployment, for good (found by the soak's quiet-point check).
func TestStats_RequestEndingAfterItsDeploymentWasForgottenLeavesNoSeries(t *testing.T) {
	s := newStats()
	gone, kept := s.deployment("gone"), s.deployment("kept")
	s.forget("gone")
	s.count("gone", gone, "chat", OutcomeRefused, "unavailable")
	s.count("kept", kept, "chat", OutcomeRefused, "unavailable")
	families, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "deployment" {
					seen[f.GetName()+"/"+l.GetValue()] = true
				}
			}
		}
	}
	for _, name := range []string{"capyctl_requests_total", "capyctl_refusals_total"} {
		if seen[name+"/gone"] {
			t.Errorf("%s has a series of the forgotten deployment", name)
		}
		if !seen[name+"/kept"] {
			t.Errorf("%s has no series of the deployment that is still there", name)
		}
	}
}
