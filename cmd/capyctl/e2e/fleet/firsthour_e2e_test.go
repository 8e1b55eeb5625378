// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet_test

import (
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestFleet_DeployConverges: on a server, capyctl deploy --file says
// "created" for a creation (a server answers it with the deployment's
// status, which once read as "updated"), the same file again is a no-op
// that exits 0, and a changed one a new revision on the host.
func TestFleet_DeployConverges(t *testing.T) {
	f := e2e.StartFleet(t, map[string]string{"gpu-a": "24GiB"})
	spec := harness.SimpleSpec("conv", "fake")
	out, errOut, code := f.Deploy("conv", spec)
	if code != 0 || !strings.Contains(out, "Deployment conv created (revision 1") {
		t.Fatalf("first deploy on a server: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = f.Deploy("conv", spec)
	if code != 0 || !strings.Contains(out, "Deployment conv unchanged (revision 1") {
		t.Fatalf("the same file again on a server: exit %d\n%s%s", code, out, errOut)
	}
	changed := strings.Replace(spec, "  model {", "  request_deadline = \"90s\"\n  model {", 1)
	out, errOut, code = f.Deploy("conv", changed)
	if code != 0 || !strings.Contains(out, "Deployment conv updated to revision 2") {
		t.Fatalf("a changed file on a server: exit %d\n%s%s", code, out, errOut)
	}
	if st := f.Status("conv"); st.Revision != 2 {
		t.Fatalf("conv on the server after the change: revision %d", st.Revision)
	}
}
