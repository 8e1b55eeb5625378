// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"fmt"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// legalTransitions is the state machine written out by hand, one edge a
// line, from the diagram in states.go: the table there must allow exactly
// these edges.
var legalTransitions = []string{
	"stopped -> starting", "stopped -> reconciling",
	"starting -> ready", "starting -> stopping", "starting -> stopped", "starting -> failed", "starting -> reconciling",
	"ready -> draining", "ready -> stopping", "ready -> stopped", "ready -> failed", "ready -> reconciling",
	"draining -> parking", "draining -> stopping", "draining -> ready", "draining -> failed", "draining -> reconciling",
	"parking -> parked", "parking -> ready", "parking -> stopping", "parking -> failed", "parking -> reconciling",
	"parked -> waking", "parked -> starting", "parked -> stopping", "parked -> stopped", "parked -> failed", "parked -> reconciling",
	"waking -> ready", "waking -> stopping", "waking -> failed", "waking -> reconciling",
	"stopping -> stopped", "stopping -> failed", "stopping -> reconciling",
	"failed -> starting", "failed -> stopping", "failed -> stopped", "failed -> reconciling",
	"reconciling -> stopped", "reconciling -> ready", "reconciling -> parked", "reconciling -> failed", "reconciling -> stopping",
}

// TestTransitions_EveryPair checks every ordered pair of states: the pairs
// listed above are legal, every other (self-loops included) is refused
// with conflict. Adding or removing an edge in states.go fails it.
func TestTransitions_EveryPair(t *testing.T) {
	legal := map[string]bool{}
	for _, e := range legalTransitions {
		legal[e] = true
	}
	seen := 0
	for _, from := range States() {
		for _, to := range States() {
			edge := fmt.Sprintf("%s -> %s", from, to)
			want := legal[edge]
			if want {
				seen++
			}
			if got := CanTransition(from, to); got != want {
				t.Errorf("CanTransition(%s) = %v, want %v", edge, got, want)
			}
			err := checkTransition(from, to)
			switch {
			case want && err != nil:
				t.Errorf("checkTransition(%s) = %v, want nil", edge, err)
			case !want && !structs.HasCode(err, structs.CodeConflict):
				t.Errorf("checkTransition(%s) = %v, want conflict", edge, err)
			}
		}
	}
	if seen != len(legalTransitions) {
		t.Fatalf("%d of the %d listed edges are between known states: a state is missing from States()", seen, len(legalTransitions))
	}
	if len(States()) != len(transitions) {
		t.Fatalf("States() lists %d states, the table %d", len(States()), len(transitions))
	}
}

// TestHoldsProcesses: only stopped and failed instances are known to hold
// no engine process (their memory may be released without proof).
func TestHoldsProcesses(t *testing.T) {
	for _, s := range States() {
		want := s != structs.StateStopped && s != structs.StateFailed
		if got := holdsProcesses(s); got != want {
			t.Errorf("holdsProcesses(%s) = %v, want %v", s, got, want)
		}
	}
}
