// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"fmt"
	"testing"
)

// TestState_HostsByName: Hosts lists the hosts by name, whatever the order
// they joined in (a map's order would change from one call to the next).
func TestState_HostsByName(t *testing.T) {
	s, _ := openTestState(t)
	for _, h := range []string{"gpu-c", "gpu-a", "gpu-d", "gpu-b"} {
		if _, _, err := s.Apply(HostJoined{Host: h}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, h := range s.Hosts() {
		got = append(got, h.Name)
	}
	if want := "[gpu-a gpu-b gpu-c gpu-d]"; fmt.Sprint(got) != want {
		t.Fatalf("hosts %v, want %s", got, want)
	}
}
