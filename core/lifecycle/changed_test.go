// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestManager_ChangedOnEveryRecordWrite: a transition and a refusal that
// changes no state (a parked instance refused a wake for lack of room:
// its last error only) both wake Changed's waiters, and the refusal is on
// the record (a server waiting for the host's ledger verdict reads it).
func TestManager_ChangedOnEveryRecordWrite(t *testing.T) {
	f := newFixture(t, 10, 6, 1)
	f.deploy("a")
	f.deploy("b")
	ctx := context.Background()
	changed := f.m.Changed()
	if err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("a start's transitions did not wake Changed")
	}
	if err := f.m.ParkDeployment(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if err := f.m.StartDeployment(ctx, "b", StartOptions{Wait: true}); err != nil {
		t.Fatal(err)
	}
	changed = f.m.Changed()
	err := f.m.StartDeployment(ctx, "a", StartOptions{Wait: true})
	if !structs.HasCode(err, structs.CodeCapacityBlocked) {
		t.Fatalf("a wake with no room: %v", err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("a refused wake did not wake Changed")
	}
	if f.state("a") != structs.StateParked {
		t.Fatalf("a is %s", f.state("a"))
	}
	v, err := f.m.Deployment("a")
	if err != nil || v.Instances[0].LastError == nil || v.Instances[0].LastError.Code != structs.CodeCapacityBlocked {
		t.Fatalf("the parked instance's record after a refused wake: %+v, %v", v.Instances[0].LastError, err)
	}
}
