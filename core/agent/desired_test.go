// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/engines"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/store"
)

// TestApplyDesired_WritesOnlyWhatChanged: a share the host applied before
// is applied again without a store write (each a synced write on the way
// to the host's answer, and to the start it carries); a record that
// changes is written.
func TestApplyDesired_WritesOnlyWhatChanged(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	a := &Agent{Store: st, logger: hclog.NewNullLogger(), Engines: engines.New(st, nil, nil)}
	share := &hostv1.Desired{Term: 2, Index: 7}
	if res := a.ApplyDesired(context.Background(), share); len(res) != 0 {
		t.Fatalf("an empty share: %v", res)
	}
	before := st.Commits()
	for i := 0; i < 3; i++ {
		if res := a.ApplyDesired(context.Background(), share); len(res) != 0 {
			t.Fatalf("an empty share again: %v", res)
		}
	}
	if n := st.Commits() - before; n != 0 {
		t.Fatalf("the same share applied three times made %d store writes, want 0", n)
	}
	a.saveClusterDeployments(map[string]placedRecord{"demo": {Revision: 1, Digest: "d1"}})
	a.saveClusterDeployments(map[string]placedRecord{"demo": {Revision: 1, Digest: "d1"}})
	a.saveClusterDeployments(map[string]placedRecord{"demo": {Revision: 2, Digest: "d2"}})
	if n := st.Commits() - before; n != 2 {
		t.Fatalf("two changes of the record made %d store writes, want 2", n)
	}
	if got := a.clusterDeployments()["demo"]; got.Revision != 2 || got.Digest != "d2" {
		t.Fatalf("the record the store holds: %+v", got)
	}
}
