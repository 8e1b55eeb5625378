// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestControllerExample runs the guide's program against a role, with the
// testkit's fake engine registered under the name the guide uses.
func TestControllerExample(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	r.AddFakeEngine("llamacpp")
	r.WriteFile("models/ctl/README", "fake model\n")
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, r.Mgmt, "ctl-demo", "llamacpp", "ctl", out); err != nil {
		t.Fatalf("the example failed: %v\n%s", err, r.Output())
	}
	data, _ := os.ReadFile(out.Name())
	for _, want := range []string{"created ctl-demo revision 1", "instance_ready ctl-demo/0", "revision 2 replaces 1", "after stop: stopped", "deleted ctl-demo"} {
		if !strings.Contains(string(data), want) {
			t.Fatalf("%q not in the example's output:\n%s", want, data)
		}
	}
}
