// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import "testing"

// Fleet is the fleet profile: a server and two hosts.
var Fleet = Profile{Name: "fleet", Ops: 300, QuietEvery: 25, Table: true}

// RunFleet runs the fleet profile.
func RunFleet(t testing.TB, p Profile, seed uint64) {
	t.Skip("TODO")
}
